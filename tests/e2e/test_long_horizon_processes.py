"""Long-horizon agents with real worker processes on both brokers, through the real SDKs against
the fake providers (zero latency; they record each request's raw bytes):

* a 300-round run completes; its worker SIGKILLed right after round 150's model call committed,
  the next worker's first request carries the previous request's bytes as its prefix (as does
  every request of the run), `cache_control` markers aside; Anthropic requests carry at most
  the provider's four breakpoints; a fork at round 280 sends, as its first request, the
  origin's round-280 request byte for byte (its own run id as the prompt cache key);
* a `compact` step runs past a `maxInputTokens` its full transcript would exceed, every request
  with valid tool-call pairing, its worker SIGKILLed right after a compaction committed (the
  summary is read from the checkpoint, never asked for again);
* a step without `context` over the window fails with CONTEXT_TOO_LONG.

The 300-round case runs once per broker, each with one provider (RabbitMQ + OpenAI, Redis +
Anthropic): both brokers and both providers are covered without four 300-round runs.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from stevora.engine import commands
from stevora.engine import fork as forking
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from stevora.testing.fake_prompt_cache import FakePromptCache
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.test_crash_recovery import assert_gap_free, wait_status
from tests.e2e.workerproc import WorkerProcess
from tests.integration.loop.test_loop_compaction import SUMMARY, _tool_pairs_valid, is_compaction
from tests.integration.loop.test_loop_prompt_cache import LONG_SYSTEM

ROUNDS = 300
KILLED_AT = 150
FORKED_AT = 280
MARKER = re.compile(rb',"cache_control":\{"type":"ephemeral"\}')


def _env(fake: FakeLLMServer) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": "test",
        "OPENAI_BASE_URL": fake.openai_base_url,
        "ANTHROPIC_API_KEY": "test",
        "ANTHROPIC_BASE_URL": fake.anthropic_base_url,
    }


def _step(model: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "llm",
        "name": "agent",
        "model": model,
        "systemPrompt": LONG_SYSTEM,
        "messages": [{"role": "user", "content": "Research the topics one by one."}],
        "tools": ["finding"],
        "maxToolRounds": ROUNDS,
        **fields,
    }


def _responder(kind: str, rounds: int, size: int = 0) -> Any:
    """`finding` once per round for `rounds` rounds, then an answer. The round comes from the
    request itself (the highest call number answered, plus one), so a resumed run and a fork are
    answered alike; a compaction request gets a numbered summary."""
    summaries: list[int] = []

    def respond(body: dict[str, Any]) -> Any:
        if is_compaction(body):
            summaries.append(1)
            text = f"{SUMMARY} #{len(summaries)}"
            return openai_text(text) if kind == "openai" else anthropic_text(text)
        ids = re.findall(r'"(?:tool_call_id|tool_use_id)": ?"(?:call|toolu)_(\d+)"', json.dumps(body))
        done = max(map(int, ids)) + 1 if ids else 0
        if done >= rounds:
            return openai_text("All topics done.") if kind == "openai" else anthropic_text("All topics done.")
        arguments = {"topic": f"t{done}", "size": size}
        if kind == "openai":
            return openai_tool_calls([(f"call_{done}", "finding", json.dumps(arguments))])
        return anthropic_tool_use([(f"toolu_{done}", "finding", arguments)])

    return respond


def _parts(raw: bytes) -> tuple[bytes, bytes, bytes]:
    """A raw body as (before the messages array, the array, after it), cache markers removed."""
    body = MARKER.sub(b"", raw)
    start = body.index(b'"messages":[') + len(b'"messages":')
    text = body.decode()
    _, end = json.JSONDecoder().raw_decode(text, len(body[:start].decode()))
    end_bytes = len(text[:end].encode())
    return body[:start], body[start:end_bytes], body[end_bytes:]


def _extends(before: bytes, after: bytes) -> bool:
    """`after` is `before` with messages appended: the same bytes up to the end of `before`'s
    conversation (what a provider's prefix cache reads), markers aside."""
    pre1, msgs1, post1 = _parts(before)
    pre2, msgs2, post2 = _parts(after)
    return pre1 == pre2 and post1 == post2 and msgs2.startswith(msgs1[:-1] + b",")


@pytest.mark.broker
@pytest.mark.parametrize(
    ("broker_setup", "model"),
    [("rabbitmq", "gpt-4o-mini"), ("redis", "claude-haiku-4-5")],
    indirect=["broker_setup"],
)
async def test_a_300_round_run_killed_at_round_150_resends_its_prefix_and_a_fork_its_origins_bytes(
    broker_setup: BrokerSetup, model: str
) -> None:
    setup = broker_setup
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "long", "version": "1", "steps": [_step(model)]}
    )
    with FakeLLMServer() as fake:
        fake.prompt_cache = FakePromptCache()
        route = fake.openai if model.startswith("gpt") else fake.anthropic
        route.responder = _responder(route.kind, ROUNDS)
        dsn, env = setup.rt.settings.database_url, _env(fake)
        first = WorkerProcess(
            dsn, setup.url, setup.queue, fault=f"llm_call_committed:{KILLED_AT}", extra_env=env
        )
        second = None
        try:
            run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
            assert await first.wait_exit(120) == -9, first.log_tail()
            sent_before = len(route.requests)
            second = WorkerProcess(dsn, setup.url, setup.queue, extra_env=env)
            row = await wait_status(
                setup, run["id"], "COMPLETED", "FAILED", timeout_s=240, workers=(first, second)
            )
            assert row["status"] == "COMPLETED", row["error"]
            origin = [r.raw for r in route.requests]
            # A fork at round 280, run by the same worker.
            plan = await forking.plan_fork(
                setup.rt, setup.workspace_id, run["id"], {"step": "agent", "round": FORKED_AT}, None
            )
            fork, _ = await forking.make(setup.rt, plan, None)
            done = await wait_status(
                setup, fork["id"], "COMPLETED", "FAILED", timeout_s=240, workers=(second,)
            )
            assert done["status"] == "COMPLETED", done["error"]
            forked = [r.raw for r in route.requests[len(origin) :]]
        finally:
            first.stop()
            if second:
                second.stop()
        log = list(fake.prompt_cache.log)

    # Every round asked once: no committed round was sent again after the kill.
    assert sent_before == KILLED_AT and len(origin) == ROUNDS + 1
    calls = await setup.rt.pool.fetch(
        "SELECT round FROM llm_calls WHERE workflow_run_id = $1 AND status = 'completed' ORDER BY round",
        run["id"],
    )
    assert [c["round"] for c in calls] == list(range(1, ROUNDS + 2))
    await assert_gap_free(setup, run["id"])
    # The first request after the restart carries the last one before it as its prefix...
    assert _extends(origin[KILLED_AT - 1], origin[KILLED_AT])
    # ... as every request of the run carries the one before it (what the prefix cache reads).
    broken = [i for i in range(1, len(origin)) if not _extends(origin[i - 1], origin[i])]
    assert broken == [], broken[:5]
    if route.kind == "anthropic":  # the provider's limit of four breakpoints, in every request
        counts = {len(MARKER.findall(raw)) for raw in origin + forked}
        assert counts and max(counts) <= 4 and min(counts) >= 1, counts
    # The restarted worker's first request read the cached prefix.
    after_kill = log[KILLED_AT]
    assert after_kill.read_tokens / after_kill.prompt_tokens >= 0.9, after_kill
    # The fork's first request is the origin's round-280 request, byte for byte (run id aside).
    assert len(forked) == ROUNDS + 1 - (FORKED_AT - 1)
    first_fork = forked[0].replace(fork["id"].encode(), run["id"].encode())
    assert first_fork == origin[FORKED_AT - 1]


@pytest.mark.broker
@pytest.mark.parametrize(
    ("broker_setup", "model"),
    [("rabbitmq", "gpt-4o-mini"), ("redis", "claude-haiku-4-5")],
    indirect=["broker_setup"],
)
async def test_a_compacting_step_runs_past_its_window_and_a_kill_after_a_compaction_does_not_redo_it(
    broker_setup: BrokerSetup, model: str
) -> None:
    setup = broker_setup
    rounds = 30
    context = {"maxInputTokens": 2_000, "strategy": "compact", "keepLastRounds": 2}
    step = _step(model, systemPrompt="Be brief.", maxToolRounds=rounds, context=context)
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "compacting", "version": "1", "steps": [step]}
    )
    with FakeLLMServer() as fake:
        fake.context_window_tokens = 2_500  # the full transcript would be ~20,000 tokens
        route = fake.openai if model.startswith("gpt") else fake.anthropic
        route.responder = _responder(route.kind, rounds, size=200)
        dsn, env = setup.rt.settings.database_url, _env(fake)
        first = WorkerProcess(dsn, setup.url, setup.queue, fault="context_compacted", extra_env=env)
        second = None
        try:
            run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
            assert await first.wait_exit(60) == -9, first.log_tail()
            second = WorkerProcess(dsn, setup.url, setup.queue, extra_env=env)
            row = await wait_status(
                setup, run["id"], "COMPLETED", "FAILED", timeout_s=90, workers=(first, second)
            )
        finally:
            first.stop()
            if second:
                second.stop()
        bodies = [r.json for r in route.requests]
        raws = [r.raw for r in route.requests]

    assert row["status"] == "COMPLETED", row["error"]
    events = [
        dict(e["payload"])
        for e in await setup.rt.pool.fetch(
            "SELECT payload FROM workflow_events WHERE workflow_run_id = $1 AND event_type = 'CONTEXT_COMPACTED' "
            "ORDER BY sequence",
            run["id"],
        )
    ]
    compactions = [b for b in bodies if is_compaction(b)]
    # Each compaction asked for once: the one committed before the kill was read, not redone.
    assert len(compactions) == len(events) >= 3
    assert len(bodies) - len(compactions) == rounds + 1  # every round's request was accepted
    for body in bodies:
        _tool_pairs_valid(route.kind, body)
    assert all(e["tokensBefore"] > 2_000 for e in events)
    # Between two compactions each request carries the one before it, summary included, byte for
    # byte (markers aside): the summary is sent the same way every round, from any worker.
    previous, compacted_since, pairs = None, False, 0
    for raw, body in zip(raws, bodies, strict=True):
        if is_compaction(body):
            compacted_since = True
            continue
        if previous is not None and not compacted_since:
            assert _extends(previous, raw)
            pairs += 1
        previous, compacted_since = raw, False
    assert pairs >= rounds - 2 * len(compactions)
    await assert_gap_free(setup, run["id"])


@pytest.mark.broker
async def test_a_step_without_context_over_the_window_fails_with_context_too_long(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    step = _step("claude-haiku-4-5" if setup.name == "redis" else "gpt-4o-mini", systemPrompt="Be brief.")
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "too-long", "version": "1", "steps": [step]}
    )
    with FakeLLMServer() as fake:
        fake.context_window_tokens = 2_500
        route = fake.anthropic if setup.name == "redis" else fake.openai
        route.responder = _responder(route.kind, 20, size=200)
        worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, extra_env=_env(fake))
        try:
            run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
            row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", timeout_s=60, workers=(worker,))
        finally:
            worker.stop()
    assert row["status"] == "FAILED"
    error = row["error"]
    assert error["code"] == "CONTEXT_TOO_LONG" and error["retryable"] is False, error
    assert error["details"]["maxInputTokens"] == 2_500 and error["details"]["inputTokens"] > 2_500
