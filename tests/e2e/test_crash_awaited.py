"""Calls answered from outside the loop survive SIGKILLed workers: a child run's ending and an
accepted tool output are each recorded once, and no committed model round is sent again."""

from __future__ import annotations

import pytest

from stevora.engine import commands
from stevora.engine.steps.awaited import client as tool_outputs
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.test_crash_recovery import assert_gap_free, wait_status
from tests.e2e.workerproc import WorkerProcess

CLIENT_TOOL = {
    "name": "ask_user",
    "description": "Ask the person at the keyboard",
    "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
    "execution": "client",
}


def agent(*tools: object) -> dict[str, object]:
    return {
        "type": "llm",
        "name": "agent",
        "model": "scripted",
        "messages": [{"role": "user", "content": "go"}],
        "tools": list(tools),
    }


async def completed_rounds(setup: BrokerSetup, run_id: str) -> list[int]:
    rows = await setup.rt.pool.fetch(
        "SELECT round FROM llm_calls WHERE workflow_run_id = $1 AND status = 'completed' ORDER BY round",
        run_id,
    )
    return [r["round"] for r in rows]


@pytest.mark.broker
@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)
async def test_killed_between_a_child_runs_ending_and_the_parents_resume(broker_setup: BrokerSetup) -> None:
    setup = broker_setup
    await create_definition(
        setup.rt,
        setup.workspace_id,
        {
            "name": "child",
            "version": "1",
            "steps": [{"type": "task", "name": "work", "handler": "slow_effect", "config": {"sleepS": 0.05}}],
        },
    )
    parent_def = await create_definition(
        setup.rt,
        setup.workspace_id,
        {"name": "parent", "version": "1", "steps": [agent({"name": "delegate", "workflow": "child"})]},
    )
    first = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault="parent_told")
    second = None
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, parent_def)
        assert await first.wait_exit(40) == -9, first.log_tail()  # died right after telling the parent
        second = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(first, second))
        assert row["status"] == "COMPLETED", row["error"]
    finally:
        first.stop()
        if second:
            second.stop()
    pool = setup.rt.pool
    child = await pool.fetchrow("SELECT id, status FROM workflow_runs WHERE parent_run_id = $1", run["id"])
    assert child["status"] == "COMPLETED"
    traces = await pool.fetch(
        "SELECT child_run_id, status FROM tool_trace WHERE workflow_run_id = $1", run["id"]
    )
    assert [(t["child_run_id"], t["status"]) for t in traces] == [(child["id"], "completed")]
    assert await completed_rounds(setup, run["id"]) == [1, 2]
    types = await assert_gap_free(setup, run["id"])
    assert types.count("TOOL_CALL_COMPLETED") == 1 and types.count("LLM_CALL_COMPLETED") == 2


@pytest.mark.broker
@pytest.mark.parametrize("broker_setup", ["rabbitmq", "redis"], indirect=True)
async def test_killed_between_an_accepted_tool_output_and_the_resumed_model_call(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "asks", "version": "1", "steps": [agent(CLIENT_TOOL)]}
    )
    first = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault="llm_call_starting:2")
    second = None
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        await wait_status(setup, run["id"], "WAITING", workers=(first,))
        call_id = await setup.rt.pool.fetchval(
            "SELECT tool_call_id FROM awaited_tool_calls WHERE workflow_run_id = $1", run["id"]
        )
        await tool_outputs.submit_tool_outputs(
            setup.rt,
            setup.workspace_id,
            run["id"],
            [tool_outputs.ToolOutput(call_id, output={"answer": "yes"})],
        )
        assert await first.wait_exit(40) == -9, first.log_tail()  # died before sending round 2
        second = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(first, second))
        assert row["status"] == "COMPLETED", row["error"]
        # A client retrying its submission after the crash changes nothing.
        await tool_outputs.submit_tool_outputs(
            setup.rt,
            setup.workspace_id,
            run["id"],
            [tool_outputs.ToolOutput(call_id, output={"answer": "yes"})],
        )
    finally:
        first.stop()
        if second:
            second.stop()
    traces = await setup.rt.pool.fetch(
        "SELECT output_json FROM tool_trace WHERE workflow_run_id = $1", run["id"]
    )
    assert [t["output_json"] for t in traces] == [{"answer": "yes"}]
    assert await completed_rounds(setup, run["id"]) == [1, 2]
    types = await assert_gap_free(setup, run["id"])
    assert types.count("TOOL_CALL_COMPLETED") == 1 and types.count("LLM_CALL_COMPLETED") == 2


@pytest.mark.broker
@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)
async def test_a_state_update_survives_a_kill_between_the_handlers_return_and_its_commit_applied_once(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "remembers", "version": "1", "steps": [agent("remember")]}
    )
    first = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault="tool_returned:1:0")
    second = None
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        assert await first.wait_exit(40) == -9, first.log_tail()  # the handler ran; its commit did not
        second = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(first, second))
        assert row["status"] == "COMPLETED", row["error"]
    finally:
        first.stop()
        if second:
            second.stop()
    (trace,) = await setup.rt.pool.fetch(
        "SELECT idempotency_key FROM tool_trace WHERE workflow_run_id = $1", run["id"]
    )
    key = trace["idempotency_key"]
    executions = await setup.rt.pool.fetchval(
        "SELECT executions FROM test_side_effects WHERE idempotency_key = $1", key
    )
    assert executions == 2, "the handler ran again after the kill, under the same key"
    state = await setup.rt.pool.fetchval("SELECT state FROM workflow_runs WHERE id = $1", run["id"])
    assert state["remembered"] == [key], "its state update was applied once, with its trace"
    types = await assert_gap_free(setup, run["id"])
    assert types.count("TOOL_CALL_COMPLETED") == 1
