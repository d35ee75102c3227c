"""Time travel with real worker processes on both brokers, the fake model over HTTP (its request
log) and the handlers' side-effect log (`test_side_effects`, one row per idempotency key):

* a fork at round 3 of a 5-round run never re-sends rounds 1-2 to the model nor re-runs their
  tools, sees the edited result of round 2, and completes, with a worker SIGKILLed in its first
  round (after round 3's model call committed): each call once;
* a process SIGKILLed inside the fork's transaction leaves no fork, and the retry with the same
  Idempotency-Key makes one whole fork that the key answers again;
* a replay with recorded tools runs no handler at all and reports matched / unmatched calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from stevora.engine import commands
from stevora.engine import fork as forking
from stevora.engine.steps.llm_recorded import replay_report
from stevora.testing.fake_llm import FakeLLMServer, FakeResponse, openai_text, openai_tool_calls
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.test_crash_recovery import wait_status
from tests.e2e.workerproc import ROOT, WorkerProcess

STEP = {
    "type": "llm",
    "name": "agent",
    "model": "gpt-4o-mini",
    "maxToolRounds": 10,
    "messages": [{"role": "user", "content": "record four effects"}],
    "tools": ["effect"],
}
EDITED = {"ok": False, "edited": True}


def _round_of(body: dict[str, Any]) -> int:
    return 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")


def _responder(unmatched_at: int | None = None) -> Any:
    """Rounds 1-4 each call `effect(note="n<round>")` (at `unmatched_at` a note the origin never
    sent); round 5 answers with the last tool result it saw."""

    def respond(body: dict[str, Any]) -> FakeResponse:
        r = _round_of(body)
        if r < 5:
            note = "never" if r == unmatched_at else f"n{r}"
            return openai_tool_calls([(f"call_{r}", "effect", json.dumps({"note": note}))])
        return openai_text("done: " + [m for m in body["messages"] if m["role"] == "tool"][-1]["content"])

    return respond


def _env(fake: FakeLLMServer) -> dict[str, str]:
    return {"OPENAI_API_KEY": "test", "OPENAI_BASE_URL": fake.openai_base_url}


async def _effects(setup: BrokerSetup, *run_ids: str) -> dict[str, int]:
    """The side-effect log of the runs' tool calls: executions by idempotency key (the table is
    shared by every test: only these runs' keys are read)."""
    rows = await setup.rt.pool.fetch(
        "SELECT e.idempotency_key, e.executions FROM test_side_effects e WHERE e.idempotency_key IN "
        "(SELECT idempotency_key FROM tool_trace WHERE workflow_run_id = ANY($1::text[]))",
        list(run_ids),
    )
    return {r["idempotency_key"]: r["executions"] for r in rows}


async def _origin(setup: BrokerSetup, fake: FakeLLMServer) -> dict[str, Any]:
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "tt-e2e", "version": "1", "steps": [STEP]}
    )
    worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, extra_env=_env(fake))
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(worker,))
    finally:
        worker.stop()
    assert row["status"] == "COMPLETED", row["error"]
    return row


async def _fork_process(setup: BrokerSetup, origin: str, key: str, *, fault: str | None) -> tuple[int, str]:
    """Run tests.e2e.fork_proc; (exit code, output)."""
    env = {
        **os.environ,
        "STEVORA_DATABASE_URL": setup.rt.settings.database_url,
        "STEVORA_BROKER_URL": setup.url,
        "STEVORA_QUEUE_NAME": setup.queue,
        "PYTHONPATH": str(ROOT),
        "STEVORA_LOG_LEVEL": "WARNING",
    }
    env.pop("STEVORA_FAULT_INJECTION", None)
    if fault:
        env["STEVORA_FAULT_INJECTION"] = fault
    edits = json.dumps({"toolResults": {"call_2": EDITED}})
    args = [sys.executable, "-m", "tests.e2e.fork_proc", setup.workspace_id, origin, "agent:3", key, edits]
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    return await proc.wait(), out.decode(errors="replace")


def _answer(done: tuple[int, str]) -> dict[str, Any]:
    """The fork process's answer: its last line of output (log lines may come before it)."""
    code, out = done
    assert code == 0, out
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


async def _fork_rows(setup: BrokerSetup, origin: str) -> dict[str, int]:
    row = await setup.rt.pool.fetchrow(
        "SELECT (SELECT count(*) FROM workflow_runs WHERE forked_from_run_id = $1) AS runs, "
        "(SELECT count(*) FROM llm_calls c JOIN workflow_runs r ON r.id = c.workflow_run_id "
        " WHERE r.forked_from_run_id = $1) AS calls, "
        "(SELECT count(*) FROM workflow_events WHERE workflow_run_id = $1 AND event_type = 'WORKFLOW_FORKED') "
        " AS origin_events",
        origin,
    )
    assert row is not None
    return dict(row)


@pytest.mark.broker
@pytest.mark.timeout(300)  # four processes started one after the other
async def test_a_fork_at_round_3_through_sigkills_inherits_rounds_1_2_and_runs_each_call_once(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    with FakeLLMServer() as fake:
        fake.openai.responder = _responder()
        origin = await _origin(setup, fake)
        origin_effects = await _effects(setup, origin["id"])
        assert len(origin_effects) == 4 and set(origin_effects.values()) == {1}
        sent_before = len(fake.openai.requests)

        # Killed inside the fork's transaction: no fork, nothing of it stored, no event on the origin.
        code, out = await _fork_process(setup, origin["id"], "fork-e2e", fault="fork_writing")
        assert code == -9, out
        assert await _fork_rows(setup, origin["id"]) == {"runs": 0, "calls": 0, "origin_events": 0}
        # The retry with the same key makes the fork, whole; the key answers with it again.
        fork = _answer(await _fork_process(setup, origin["id"], "fork-e2e", fault=None))
        assert fork["created"] is True
        again = await _fork_process(setup, origin["id"], "fork-e2e", fault=None)
        assert _answer(again) == {"id": fork["id"], "created": False}
        assert await _fork_rows(setup, origin["id"]) == {"runs": 1, "calls": 2, "origin_events": 1}

        # A worker killed in the fork's first round, right after round 3's model call committed.
        db, url, queue = setup.rt.settings.database_url, setup.url, setup.queue
        first = WorkerProcess(db, url, queue, fault="llm_call_committed:3", extra_env=_env(fake))
        second = None
        try:
            assert await first.wait_exit(40) == -9, first.log_tail()
            second = WorkerProcess(db, url, queue, extra_env=_env(fake))
            row = await wait_status(setup, fork["id"], "COMPLETED", "FAILED", workers=(first, second))
        finally:
            first.stop()
            if second:
                second.stop()
        assert row["status"] == "COMPLETED", row["error"]

        # The model: rounds 3, 4, 5 only, each sent once; round 3 carries round 1's result and
        # round 2's edited one.
        sent = [r.json for r in fake.openai.requests[sent_before:]]
        assert [_round_of(b) for b in sent] == [3, 4, 5]
        results = [json.loads(m["content"]) for m in sent[0]["messages"] if m["role"] == "tool"]
        assert results[0]["ok"] is True and results[1] == EDITED
    # The handlers: rounds 1-2 not run again (the origin's keys still ran once), rounds 3-4 once each.
    effects = await _effects(setup, origin["id"], fork["id"])
    assert {k: effects[k] for k in origin_effects} == origin_effects
    new = {k: n for k, n in effects.items() if k not in origin_effects}
    traces = await setup.rt.pool.fetch(
        "SELECT round, idempotency_key, inherited_from FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round",
        fork["id"],
    )
    assert [(t["round"], t["inherited_from"] is not None) for t in traces] == [
        (1, True),
        (2, True),
        (3, False),
        (4, False),
    ]
    assert new == {traces[2]["idempotency_key"]: 1, traces[3]["idempotency_key"]: 1}
    calls = await setup.rt.pool.fetch(
        "SELECT round, inherited_from FROM llm_calls WHERE workflow_run_id = $1 AND status = 'completed' "
        "ORDER BY round",
        fork["id"],
    )
    assert [(c["round"], c["inherited_from"] is not None) for c in calls] == [
        (1, True),
        (2, True),
        (3, False),
        (4, False),
        (5, False),
    ]
    # Its events are its own (an origin's events are not copied): gap-free, one per own call.
    events = await setup.rt.pool.fetch(
        "SELECT sequence, event_type FROM workflow_events WHERE workflow_run_id = $1 ORDER BY sequence",
        fork["id"],
    )
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    types = [e["event_type"] for e in events]
    assert types[0] == "WORKFLOW_FORKED" and types.count("LLM_CALL_COMPLETED") == 3
    assert types.count("TOOL_CALL_COMPLETED") == 2


@pytest.mark.broker
@pytest.mark.timeout(300)
async def test_a_replay_with_recorded_tools_runs_no_handler_on_real_workers(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    with FakeLLMServer() as fake:
        fake.openai.responder = _responder()
        origin = await _origin(setup, fake)
        before = await _effects(setup, origin["id"])
        assert len(before) == 4
        fake.openai.responder = _responder(unmatched_at=4)  # the replayed model strays at round 4
        plan = await forking.plan_replay(setup.rt, setup.workspace_id, origin["id"])
        replay, _ = await forking.create_fork(setup.rt, plan, origin["definition_id"], None)
        worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, extra_env=_env(fake))
        try:
            row = await wait_status(setup, replay["id"], "COMPLETED", "FAILED", workers=(worker,))
        finally:
            worker.stop()
    assert row["status"] == "COMPLETED", row["error"]
    # No handler ran: the origin's effects ran once still, the replay's calls have none.
    assert await _effects(setup, origin["id"], replay["id"]) == before
    assert await replay_report(setup.rt.pool, replay["id"]) == {"matched": 3, "unmatched": 1, "live": 0}
    traces = await setup.rt.pool.fetch(
        "SELECT round, status, error_code FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round",
        replay["id"],
    )
    assert [(t["round"], t["status"], t["error_code"]) for t in traces] == [
        (1, "completed", None),
        (2, "completed", None),
        (3, "completed", None),
        (4, "failed", "TOOL_CALL_NOT_RECORDED"),
    ]
