"""Real worker processes, a real broker, SIGKILL at named points: the run still finishes right."""

from __future__ import annotations

import asyncio

import pytest

from stevora.engine import commands
from stevora.engine.dispatch import EXECUTE_RUN_ACTOR, RecordingDispatcher
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.workerproc import WorkerProcess
from tests.integration.loop.test_loop_basics import CONSISTENCY_SQL


async def wait_status(
    setup: BrokerSetup,
    run_id: str,
    *statuses: str,
    timeout_s: float = 45.0,
    workers: tuple[WorkerProcess, ...] = (),
) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        row = await setup.rt.pool.fetchrow("SELECT * FROM workflow_runs WHERE id = $1", run_id)
        if row["status"] in statuses:
            return dict(row)
        if asyncio.get_running_loop().time() > deadline:
            logs = "\n".join(w.log_tail() for w in workers)
            raise AssertionError(
                f"run {run_id} stuck in {row['status']} ({row['error']}); worker logs:\n{logs}"
            )
        await asyncio.sleep(0.1)


async def assert_gap_free(setup: BrokerSetup, run_id: str) -> list[str]:
    events = await setup.rt.pool.fetch(
        "SELECT sequence, event_type FROM workflow_events WHERE workflow_run_id = $1 ORDER BY sequence",
        run_id,
    )
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    row = await setup.rt.pool.fetchrow(CONSISTENCY_SQL, run_id)
    assert row["events_without_trace"] == 0 and row["traces_without_one_event"] == 0
    return [e["event_type"] for e in events]


async def create_undispatched(setup: BrokerSetup, def_id: str) -> dict:
    """Create a run whose dispatch message never reaches the broker."""
    real = setup.rt.dispatcher
    setup.rt.dispatcher = RecordingDispatcher()
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
    finally:
        setup.rt.dispatcher = real
    return dict(run)


async def killed_then_resumed(setup: BrokerSetup, def_id: str, fault: str) -> tuple[dict, dict]:
    """Run `def_id` on a worker that SIGKILLs itself at `fault`, then on a second worker; returns
    the created run and its final row, which must be COMPLETED."""
    first = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault=fault)
    second = None
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        assert await first.wait_exit(40) == -9, first.log_tail()  # it SIGKILLed itself at the fault point
        second = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(first, second))
        assert row["status"] == "COMPLETED", row["error"]
    finally:
        first.stop()
        if second:
            second.stop()
    return dict(run), row


LOOP_STEP = {
    "type": "llm",
    "name": "agent",
    "model": "scripted:rounds=5",
    "maxToolRounds": 5,
    "messages": [{"role": "user", "content": "record five effects"}],
    "tools": ["effect"],
}


@pytest.mark.broker
@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)  # crash points are broker-independent
# step_started: killed right after the claim that started the run and its step (nothing committed
# inside the step yet); the next worker must resume it, not start it again.
@pytest.mark.parametrize(
    "fault", ["step_started:agent", "llm_call_committed:3", "tool_returned:3:0", "tool_committed:3:0"]
)
async def test_worker_killed_at_a_checkpoint_of_a_five_round_loop_resumes_exactly_once(
    broker_setup: BrokerSetup, fault: str
) -> None:
    setup = broker_setup
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "loop", "version": "1", "steps": [LOOP_STEP]}
    )
    run, _ = await killed_then_resumed(setup, def_id, fault)
    pool = setup.rt.pool
    traces = await pool.fetch("SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round", run["id"])
    assert [t["round"] for t in traces] == [1, 2, 3, 4, 5] and all(t["status"] == "completed" for t in traces)
    calls = await pool.fetch(
        "SELECT round FROM llm_calls WHERE workflow_run_id = $1 AND status = 'completed' ORDER BY round",
        run["id"],
    )
    assert [c["round"] for c in calls] == [1, 2, 3, 4, 5, 6]  # no committed round was sent to the model again
    effects = {
        r["idempotency_key"]: r["executions"]
        for r in await pool.fetch(
            "SELECT * FROM test_side_effects WHERE idempotency_key = ANY($1::text[])",
            [t["idempotency_key"] for t in traces],
        )
    }
    assert len(effects) == 5  # one side effect per tool call
    reran = {k for k, n in effects.items() if n > 1}
    # Only a handler that returned but was not committed runs again, under the same key.
    assert reran == ({traces[2]["idempotency_key"]} if fault.startswith("tool_returned") else set())
    types = await assert_gap_free(setup, run["id"])
    assert types.count("TOOL_CALL_COMPLETED") == 5 and types.count("LLM_CALL_COMPLETED") == 6
    # Started once: the resuming worker's claim takes over a RUNNING run, it does not start it again.
    assert types.count("WORKFLOW_STARTED") == 1 and types.count("STEP_STARTED") == 1
    assert await pool.fetchval("SELECT count(*) FROM step_runs WHERE workflow_run_id = $1", run["id"]) == 1


@pytest.mark.broker
@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)
@pytest.mark.parametrize("fault", ["tool_returned:3:0", "tool_committed:3:0"])
async def test_a_toolboxs_state_survives_the_worker_killed_mid_loop(
    broker_setup: BrokerSetup, fault: str
) -> None:
    """Issue 22: the run's toolbox instance is its state, not a worker's memory. The resuming
    worker continues the count where the last committed call left it (1..5), and a call that ran
    but did not commit runs again from the committed state, not on top of its lost result."""
    setup = broker_setup
    step = {**LOOP_STEP, "messages": [{"role": "user", "content": "count five times"}], "tools": ["Tally"]}
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "tally", "version": "1", "steps": [step]}
    )
    run, row = await killed_then_resumed(setup, def_id, fault)
    traces = await setup.rt.pool.fetch(
        "SELECT tool_name, output_json FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round", run["id"]
    )
    assert [(t["tool_name"], t["output_json"]) for t in traces] == [("Tally_add", n) for n in range(1, 6)]
    assert row["state"]["toolbox:Tally"] == {"calls": 5, "attributes": {"count": 5}}


@pytest.mark.broker
@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)
@pytest.mark.parametrize("fault", ["tool_returned:1:0", "tool_committed:1:0"])
async def test_a_tools_goto_survives_the_worker_killed_before_the_step_ends(
    broker_setup: BrokerSetup, fault: str
) -> None:
    """Issue 22, tools that steer: the goto is written with the call's trace row. Killed after that
    commit, the resuming worker goes to the target without running the tool or asking the model
    again; killed before it, the tool runs again under the same key and then goes there."""
    setup = broker_setup
    step = {**LOOP_STEP, "model": "scripted:rounds=3", "messages": [{"role": "user", "content": "route it"}]}
    spec = {
        "name": "steer",
        "version": "1",
        "steps": [
            {**step, "tools": ["route"], "gotoTargets": ["finish"]},
            {"type": "task", "name": "middle", "handler": "slow_effect", "config": {"sleepS": 0}},
            {"type": "task", "name": "finish", "handler": "slow_effect", "config": {"sleepS": 0}},
        ],
    }
    def_id = await create_definition(setup.rt, setup.workspace_id, spec)
    run, row = await killed_then_resumed(setup, def_id, fault)
    pool = setup.rt.pool
    steps = await pool.fetch(
        "SELECT step_name, status FROM step_runs WHERE workflow_run_id = $1 ORDER BY created_at, step_index",
        run["id"],
    )
    assert [(s["step_name"], s["status"]) for s in steps] == [
        ("agent", "COMPLETED"),
        ("middle", "SKIPPED"),
        ("finish", "COMPLETED"),
    ]
    assert row["state"].get("finish") == "done" and "middle" not in row["state"]
    # One model call: the goto round's answer is never asked for, before or after the crash.
    assert await pool.fetchval("SELECT count(*) FROM llm_calls WHERE workflow_run_id = $1", run["id"]) == 1
    trace = await pool.fetchrow("SELECT * FROM tool_trace WHERE workflow_run_id = $1", run["id"])
    assert trace["goto_step"] == "finish"
    executions = await pool.fetchval(
        "SELECT executions FROM test_side_effects WHERE idempotency_key = $1", trace["idempotency_key"]
    )
    assert executions == (2 if fault.startswith("tool_returned") else 1)  # a committed call never runs again
    types = await assert_gap_free(setup, run["id"])
    assert types.count("TOOL_CALL_COMPLETED") == 1 and types.count("STEP_SKIPPED") == 1


@pytest.mark.broker
async def test_worker_killed_during_a_slow_task_is_finished_by_another_worker(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    def_id = await create_definition(
        setup.rt,
        setup.workspace_id,
        {
            "name": "slow",
            "version": "1",
            "steps": [
                {"type": "task", "name": "slow", "handler": "slow_effect", "config": {"sleepS": 3}},
                {"type": "task", "name": "quick", "handler": "slow_effect", "config": {"sleepS": 0.05}},
            ],
        },
    )
    first = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
    second = None
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        for _ in range(300):
            if await setup.rt.pool.fetchval(
                "SELECT count(*) FROM workflow_events WHERE workflow_run_id = $1 "
                "AND event_type = 'STEP_STARTED'",
                run["id"],
            ):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        first.kill()  # mid-task: its side effect has not happened yet
        second = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(first, second))
        assert row["status"] == "COMPLETED", row["error"]
    finally:
        first.stop()
        if second:
            second.stop()
    steps = await setup.rt.pool.fetch(
        "SELECT id FROM step_runs WHERE workflow_run_id = $1 ORDER BY created_at, step_index", run["id"]
    )
    effects = await setup.rt.pool.fetch(
        "SELECT * FROM test_side_effects WHERE idempotency_key = ANY($1::text[])",
        [f"task:{s['id']}" for s in steps],
    )
    assert sorted(e["executions"] for e in effects) == [1, 1]  # each step's side effect recorded once
    types = await assert_gap_free(setup, run["id"])
    assert types.count("STEP_COMPLETED") == 2 and types[-1] == "WORKFLOW_COMPLETED"


@pytest.mark.broker
async def test_the_same_message_delivered_twice_concurrently_executes_once(broker_setup: BrokerSetup) -> None:
    setup = broker_setup
    def_id = await create_definition(
        setup.rt,
        setup.workspace_id,
        {
            "name": "dup",
            "version": "1",
            "steps": [{"type": "task", "name": "once", "handler": "slow_effect", "config": {"sleepS": 0.5}}],
        },
    )
    run = await create_undispatched(setup, def_id)
    real = setup.rt.dispatcher
    worker = WorkerProcess(
        setup.rt.settings.database_url,
        setup.url,
        setup.queue,
        extra_env={"STEVORA_UNDISPATCHED_GRACE_S": "60"},
    )  # keep the sweep out of it
    try:
        await asyncio.gather(*(asyncio.to_thread(real.send, EXECUTE_RUN_ACTOR, run["id"]) for _ in range(2)))  # type: ignore[attr-defined]
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(worker,))
        assert row["status"] == "COMPLETED"
    finally:
        worker.stop()
    step = await setup.rt.pool.fetchrow("SELECT id FROM step_runs WHERE workflow_run_id = $1", run["id"])
    executions = await setup.rt.pool.fetchval(
        "SELECT executions FROM test_side_effects WHERE idempotency_key = $1", f"task:{step['id']}"
    )
    assert executions == 1
    types = await assert_gap_free(setup, run["id"])
    assert types.count("STEP_STARTED") == 1


@pytest.mark.broker
async def test_a_lost_message_is_recovered_by_the_sweep(broker_setup: BrokerSetup) -> None:
    setup = broker_setup
    def_id = await create_definition(
        setup.rt,
        setup.workspace_id,
        {
            "name": "lost",
            "version": "1",
            "steps": [{"type": "task", "name": "only", "handler": "slow_effect", "config": {"sleepS": 0.01}}],
        },
    )
    run = await create_undispatched(setup, def_id)  # the message is "lost": never reaches the broker
    worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
    try:
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(worker,))
    finally:
        worker.stop()
    assert row["status"] == "COMPLETED"
    await assert_gap_free(setup, run["id"])


@pytest.mark.broker
@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)
async def test_a_budget_counts_what_was_used_before_a_worker_was_killed(broker_setup: BrokerSetup) -> None:
    """Killed right after round 2's tool call committed: the next worker reads the usage back from
    the committed rows and stops the run at exactly maxToolCalls, not three calls later."""
    setup = broker_setup
    spec = {"name": "budgeted-loop", "version": "1", "budget": {"maxToolCalls": 3}, "steps": [LOOP_STEP]}
    def_id = await create_definition(setup.rt, setup.workspace_id, spec)
    first = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault="tool_committed:2:0")
    second = None
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
        assert await first.wait_exit(40) == -9, first.log_tail()
        assert (
            await setup.rt.pool.fetchval(
                "SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", run["id"]
            )
            == 2
        )
        second = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(first, second))
    finally:
        first.stop()
        if second:
            second.stop()
    assert row["status"] == "FAILED" and row["error"]["code"] == "BUDGET_EXCEEDED", row["error"]
    assert row["error"]["details"]["used"]["toolCalls"] == 3
    traces = await setup.rt.pool.fetch(
        "SELECT round FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round", run["id"]
    )
    assert [t["round"] for t in traces] == [1, 2, 3]
    await assert_gap_free(setup, run["id"])
