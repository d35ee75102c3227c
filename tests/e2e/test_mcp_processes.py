"""MCP tools with real worker processes on real brokers (docs/mcp.md): an agent using MCP tools
completes with each call once in its trace and event; a worker SIGKILLed during a slow MCP call is
resumed by another worker with the pinned list, and no committed call runs again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from stevora.engine import commands
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.test_crash_recovery import assert_gap_free, wait_status
from tests.e2e.workerproc import WorkerProcess
from tests.mcp_servers import counting_stdio, logged_calls

pytestmark = pytest.mark.timeout(180)


def _mcp_config(tmp_path: Path, call_log: Path) -> Path:
    server = counting_stdio(call_log)
    path = tmp_path / "mcp.json"
    body = {"command": server.command, "args": list(server.args), "env": server.env, "cwd": server.cwd}
    path.write_text(json.dumps({"mcpServers": {"count": body}}))
    return path


def _worker(setup: BrokerSetup, config: Path) -> WorkerProcess:
    return WorkerProcess(
        setup.rt.settings.database_url, setup.url, setup.queue, extra_env={"STEVORA_MCP_CONFIG": str(config)}
    )


@pytest.mark.broker
async def test_an_agent_using_mcp_tools_completes_on_a_real_worker(
    broker_setup: BrokerSetup, tmp_path: Path
) -> None:
    setup = broker_setup
    log = tmp_path / "calls.jsonl"
    worker = _worker(setup, _mcp_config(tmp_path, log))
    try:
        step = {
            "type": "llm",
            "name": "agent",
            "model": "scripted:rounds=1",
            "messages": [{"role": "user", "content": "use the tools"}],
            "tools": [{"mcp": "count", "include": ["add", "echo"]}],
        }
        def_id = await create_definition(
            setup.rt, setup.workspace_id, {"name": "mcp", "version": "1", "steps": [step]}
        )
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(worker,))
        assert row["status"] == "COMPLETED", row["error"]
        traces = await setup.rt.pool.fetch(
            "SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY sequence", run["id"]
        )
        assert sorted(t["tool_name"] for t in traces) == ["count_add", "count_echo"]
        assert all(t["status"] == "completed" for t in traces)
        types = await assert_gap_free(setup, run["id"])
        assert types.count("TOOL_CALL_COMPLETED") == 2
        calls = logged_calls(log)
        assert sorted(c["tool"] for c in calls) == ["add", "echo"]  # each executed once
        assert {c["idempotencyKey"] for c in calls} == {t["idempotency_key"] for t in traces}
        # The worker published its server, so the API accepts definitions naming it.
        published = await setup.rt.pool.fetchval(
            "SELECT count(*) FROM mcp_worker_servers WHERE name = 'count'"
        )
        assert published >= 1
    finally:
        worker.stop()


@pytest.mark.broker
@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)  # the crash is broker-independent
async def test_a_worker_killed_during_a_slow_mcp_call_resumes_without_repeating_a_committed_call(
    broker_setup: BrokerSetup, tmp_path: Path
) -> None:
    setup = broker_setup
    log = tmp_path / "calls.jsonl"
    config = _mcp_config(tmp_path, log)
    step = {
        "type": "llm",
        "name": "agent",
        "model": "scripted:rounds=3",
        "maxToolRounds": 3,
        "messages": [{"role": "user", "content": "three slow calls"}],
        "tools": [{"mcp": "count", "include": ["slow"]}],  # the scripted model calls slow(seconds=1.0)
    }
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "slow-mcp", "version": "1", "steps": [step]}
    )
    first = _worker(setup, config)
    second = None
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        for _ in range(1200):  # round 2's call is running on the server
            if len(logged_calls(log)) >= 2:
                break
            await asyncio.sleep(0.05)
        assert len(logged_calls(log)) == 2, first.log_tail()
        first.kill()
        pinned_before = await setup.rt.pool.fetch(
            "SELECT * FROM mcp_tool_pins WHERE workflow_run_id = $1", run["id"]
        )
        second = _worker(setup, config)
        row = await wait_status(
            setup, run["id"], "COMPLETED", "FAILED", timeout_s=90, workers=(first, second)
        )
        assert row["status"] == "COMPLETED", row["error"]
    finally:
        first.stop()
        if second is not None:
            second.stop()
    pool = setup.rt.pool
    traces = await pool.fetch("SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round", run["id"])
    assert [(t["round"], t["status"]) for t in traces] == [
        (1, "completed"),
        (2, "completed"),
        (3, "completed"),
    ]
    keys = [c["idempotencyKey"] for c in logged_calls(log)]
    # Round 1 was committed before the kill: never executed again. Round 2 was in flight: it ran
    # again under the same idempotency key (at-least-once calls, exactly-once records).
    assert keys.count(traces[0]["idempotency_key"]) == 1
    assert keys.count(traces[1]["idempotency_key"]) == 2
    assert keys.count(traces[2]["idempotency_key"]) == 1
    # The resumed step offered the list pinned at its first round (one pin, unchanged).
    pinned_after = await pool.fetch("SELECT * FROM mcp_tool_pins WHERE workflow_run_id = $1", run["id"])
    assert len(pinned_before) == 1 and [dict(p) for p in pinned_after] == [dict(p) for p in pinned_before]
    types = await assert_gap_free(setup, run["id"])
    assert types.count("TOOL_CALL_COMPLETED") == 3


@pytest.mark.broker
async def test_killing_the_stdio_server_mid_run_gives_an_error_result_and_the_next_call_works(
    broker_setup: BrokerSetup, tmp_path: Path
) -> None:
    import os
    import signal

    setup = broker_setup
    log = tmp_path / "calls.jsonl"
    worker = _worker(setup, _mcp_config(tmp_path, log))
    step = {
        "type": "llm",
        "name": "agent",
        "model": "scripted:rounds=2",
        "maxToolRounds": 2,
        "messages": [{"role": "user", "content": "two slow calls"}],
        "tools": [{"mcp": "count", "include": ["slow"]}],
    }
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "kill-server", "version": "1", "steps": [step]}
    )
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        for _ in range(1200):  # round 1's call is running on the server
            if logged_calls(log):
                break
            await asyncio.sleep(0.05)
        calls = logged_calls(log)
        assert calls, worker.log_tail()
        os.kill(calls[0]["pid"], signal.SIGKILL)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", timeout_s=90, workers=(worker,))
        assert row["status"] == "COMPLETED", row["error"]
    finally:
        worker.stop()
    traces = await setup.rt.pool.fetch(
        "SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round", run["id"]
    )
    assert [(t["round"], t["status"], t["error_code"]) for t in traces] == [
        (1, "failed", "MCP_SERVER_UNAVAILABLE"),
        (2, "completed", None),
    ]
    assert len({c["pid"] for c in logged_calls(log)}) == 2  # the restarted server answered round 2
    types = await assert_gap_free(setup, run["id"])
    assert types.count("TOOL_CALL_FAILED") == 1 and types.count("TOOL_CALL_COMPLETED") == 1


@pytest.mark.broker
async def test_on_a_real_worker_only_offered_and_approved_mcp_calls_run_and_a_replay_calls_no_server(
    broker_setup: BrokerSetup, tmp_path: Path
) -> None:
    """include / exclude / approve with the model played by the fake OpenAI API (the worker's real
    SDK), then a replay with recorded tools that makes zero calls on the server (its log)."""
    from stevora.engine import fork as forking
    from stevora.engine.steps.approval import decide_approval
    from stevora.testing.fake_llm import FakeLLMServer, openai_text, openai_tool_calls

    setup = broker_setup
    log = tmp_path / "calls.jsonl"
    tools = [
        {"mcp": "count", "include": ["add", "echo"], "approve": ["echo"]},
        {"mcp": "count", "prefix": "cnt", "exclude": ["whoami", "slow", "pixel", "fail", "echo"]},
    ]
    step = {"type": "llm", "name": "agent", "model": "gpt-4o-mini", "maxToolRounds": 2, "tools": tools,
            "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "bounded-mcp", "version": "1", "steps": [step]}
    )
    with FakeLLMServer() as fake:
        round_1 = [
            ("c1", "count_add", '{"a": 2, "b": 40}'),  # included: runs
            ("c2", "count_whoami", "{}"),  # not included: never runs
            ("c3", "cnt_whoami", "{}"),  # excluded: never runs
            ("c4", "cnt_add", '{"a": 1, "b": 1}'),  # the second entry offers it: runs
            ("c5", "count_echo", '{"text": "yes"}'),  # gated: approved below, then runs
            ("c6", "count_echo", '{"text": "no"}'),  # gated: rejected below, never runs
        ]
        fake.openai.enqueue(openai_tool_calls(round_1), openai_text("42"))
        env = {"STEVORA_MCP_CONFIG": str(_mcp_config(tmp_path, log)), "OPENAI_API_KEY": "test",
               "OPENAI_BASE_URL": fake.openai_base_url}  # fmt: skip
        worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, extra_env=env)
        try:
            run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
            await wait_status(setup, run["id"], "WAITING", workers=(worker,))
            for _ in range(100):  # both approvals are asked for in the same round
                pending = await setup.rt.pool.fetch(
                    "SELECT a.id, c.arguments FROM approval_requests a JOIN awaited_tool_calls c "
                    "ON c.id = a.awaited_tool_call_id WHERE a.workflow_run_id = $1 ORDER BY c.sequence",
                    run["id"],
                )
                if len(pending) == 2:
                    break
                await asyncio.sleep(0.1)
            assert [p["arguments"] for p in pending] == [{"text": "yes"}, {"text": "no"}]
            assert sorted(c["tool"] for c in logged_calls(log)) == ["add", "add"]  # none gated yet
            for row, decision in zip(pending, ("approved", "rejected"), strict=True):
                await decide_approval(setup.rt, setup.workspace_id, row["id"], decision, decided_by="ann")
            row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(worker,))
            assert row["status"] == "COMPLETED", row["error"]
            before_replay = logged_calls(log)
            plan = await forking.plan_replay(setup.rt, setup.workspace_id, run["id"])
            replay, _ = await forking.make(setup.rt, plan, None)
            fake.openai.enqueue(openai_tool_calls(round_1), openai_text("42 again"))
            replayed = await wait_status(
                setup, replay["id"], "COMPLETED", "FAILED", "WAITING", workers=(worker,)
            )
        finally:
            worker.stop()
    traces = await setup.rt.pool.fetch(
        "SELECT tool_name, status, error_code, output_json FROM tool_trace WHERE workflow_run_id = $1 "
        "ORDER BY sequence",
        run["id"],
    )
    assert [(t["tool_name"], t["status"], t["error_code"]) for t in traces] == [
        ("count_add", "completed", None),
        ("count_whoami", "failed", "TOOL_NOT_OFFERED"),
        ("cnt_whoami", "failed", "TOOL_NOT_OFFERED"),
        ("cnt_add", "completed", None),
        ("count_echo", "completed", None),
        ("count_echo", "failed", "APPROVAL_REJECTED"),
    ]
    assert sorted((c["tool"], json.dumps(c["arguments"])) for c in before_replay) == [
        ("add", '{"a": 1, "b": 1}'), ("add", '{"a": 2, "b": 40}'), ("echo", '{"text": "yes"}'),
    ]  # fmt: skip
    # The replay answered every call from the recording: the server ran nothing more.
    assert replayed["status"] == "COMPLETED", replayed["error"]
    assert logged_calls(log) == before_replay
    outputs = await setup.rt.pool.fetch(
        "SELECT tool_name, output_json FROM tool_trace WHERE workflow_run_id = $1 AND status = 'completed' "
        "ORDER BY sequence",
        replay["id"],
    )
    assert [(t["tool_name"], t["output_json"]) for t in outputs] == [
        ("count_add", {"sum": 42}), ("cnt_add", {"sum": 2}), ("count_echo", {"result": "yes"}),
    ]  # fmt: skip
