"""A worker SIGKILLed in the middle of a group commit (a batch carrying several runs' checkpoints):
after a restart every run completes, each row that was committed is seen and not redone, and none
that was not committed is taken for done."""

from __future__ import annotations

import pytest

from stevora.engine import commands
from stevora.ids import new_id
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.test_crash_recovery import LOOP_STEP, assert_gap_free, wait_status
from tests.e2e.workerproc import WorkerProcess

RUNS = 6  # concurrent five-round loops in one worker: their checkpoints share batches


@pytest.mark.broker
@pytest.mark.parametrize(
    ("broker_setup", "fault"),
    [
        ("rabbitmq", "batch_sending:tool_trace:2"),  # queued, nothing sent: none of it committed
        ("rabbitmq", "batch_sent:tool_trace:2"),  # on the wire: committed or not, never half
        ("rabbitmq", "batch_committed:tool_trace:2"),  # committed, no caller woken
        ("rabbitmq", "batch_committed:llm_call:2"),
        ("redis", "batch_sent:tool_trace:2"),
    ],
    indirect=["broker_setup"],
)
async def test_worker_killed_mid_batch_resumes_every_run_exactly_once(
    broker_setup: BrokerSetup, fault: str
) -> None:
    setup = broker_setup
    pool = setup.rt.pool
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "loop", "version": "1", "steps": [LOOP_STEP]}
    )
    # Queued before the worker starts, so it takes them all at once and their rounds interleave.
    run_ids = [
        (await commands.create_run(setup.rt, setup.workspace_id, def_id))[0]["id"] for _ in range(RUNS)
    ]
    first = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault=fault)
    second = None
    try:
        assert await first.wait_exit(60) == -9, first.log_tail()  # it SIGKILLed itself mid-batch
        # What was durable at the kill, and which handlers had run.
        committed = {
            r["idempotency_key"]
            for r in await pool.fetch(
                "SELECT idempotency_key FROM tool_trace WHERE workflow_run_id = ANY($1::text[])", run_ids
            )
        }
        calls_at_kill = await pool.fetchval(
            "SELECT count(*) FROM llm_calls WHERE workflow_run_id = ANY($1::text[])", run_ids
        )
        ran = {
            r["idempotency_key"]: r["executions"]
            for r in await pool.fetch(
                "SELECT e.* FROM test_side_effects e JOIN step_runs s ON e.idempotency_key LIKE s.id || ':%' "
                "WHERE s.workflow_run_id = ANY($1::text[])",
                run_ids,
            )
        }
        assert committed <= set(ran) and all(n == 1 for n in ran.values())
        second = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        for run_id in run_ids:
            row = await wait_status(
                setup, run_id, "COMPLETED", "FAILED", workers=(first, second), timeout_s=90
            )
            assert row["status"] == "COMPLETED", row["error"]
    finally:
        first.stop()
        if second:
            second.stop()

    assert calls_at_kill >= 2  # the kill came mid-loop, after model calls of several runs
    keys: list[str] = []
    for run_id in run_ids:
        traces = await pool.fetch(
            "SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round", run_id
        )
        assert [t["round"] for t in traces] == [1, 2, 3, 4, 5] and all(
            t["status"] == "completed" for t in traces
        )
        calls = await pool.fetch(
            "SELECT round FROM llm_calls WHERE workflow_run_id = $1 AND status = 'completed' ORDER BY round",
            run_id,
        )
        assert [c["round"] for c in calls] == [1, 2, 3, 4, 5, 6]  # one row per round, none sent twice
        types = await assert_gap_free(setup, run_id)
        assert types.count("TOOL_CALL_COMPLETED") == 5 and types.count("LLM_CALL_COMPLETED") == 6
        keys += [t["idempotency_key"] for t in traces]
    executions = {
        r["idempotency_key"]: r["executions"]
        for r in await pool.fetch(
            "SELECT * FROM test_side_effects WHERE idempotency_key = ANY($1::text[])", keys
        )
    }
    assert set(executions) == set(keys)  # one side effect per tool call
    for key in keys:
        if key in committed:
            assert executions[key] == 1, key  # committed before the kill: seen, not redone
        elif key in ran:
            assert executions[key] == 2, key  # ran but not committed: not taken for done, ran again
        else:
            assert executions[key] == 1, key
    if fault.startswith("batch_sending:tool_trace"):
        # The batch that never left held several runs' finished calls; each ran again.
        assert len(set(ran) - committed) >= 2


@pytest.mark.broker
@pytest.mark.parametrize("fault", ["batch_sent:completion:1", "batch_committed:completion:1"])
@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)  # crash points are broker-independent
async def test_worker_killed_mid_batch_of_endings_completes_every_run_once(
    broker_setup: BrokerSetup, fault: str
) -> None:
    """Runs whose handlers return in the same turn of the loop end together: their completions share one
    statement, and the worker is killed with it on the wire or committed. After a restart every
    run is COMPLETED once, with gap-free events and one outbox row; a handler whose ending had
    committed is not run again."""
    setup = broker_setup
    pool = setup.rt.pool
    await pool.execute(
        "INSERT INTO webhooks (id, workspace_id, url, events, secret, is_active) "
        "VALUES ($1, $2, 'https://example.invalid/hook', '[\"workflow.completed\"]'::jsonb, 'whsec_test', true)",
        new_id("wh"),
        setup.workspace_id,
    )
    step = {"type": "task", "name": "together", "handler": "ends_together"}
    def_id = await create_definition(
        setup.rt, setup.workspace_id, {"name": "end", "version": "1", "steps": [step]}
    )
    given = {"group": new_id("grp"), "n": RUNS}  # each handler returns once all RUNS are in it
    run_ids = [
        (await commands.create_run(setup.rt, setup.workspace_id, def_id, given))[0]["id"] for _ in range(RUNS)
    ]
    workers = [WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault=fault)]
    try:
        assert await workers[0].wait_exit(60) == -9, workers[0].log_tail()  # it SIGKILLed itself mid-batch
        ended = set(
            await pool.fetchval(
                "SELECT coalesce(array_agg(id), '{}') FROM workflow_runs WHERE id = ANY($1::text[]) "
                "AND status = 'COMPLETED'",
                run_ids,
            )
        )
        if fault.startswith("batch_committed"):
            assert len(ended) >= 2  # the batch's runs: committed, none of them woken
        workers.append(WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue))
        finals = [
            await wait_status(setup, run_id, "COMPLETED", "FAILED", workers=tuple(workers), timeout_s=90)
            for run_id in run_ids
        ]
    finally:
        for worker in workers:
            worker.stop()
    assert [f["status"] for f in finals] == ["COMPLETED"] * RUNS, [f["error"] for f in finals]
    for run_id in run_ids:
        types = await assert_gap_free(setup, run_id)
        assert types.count("WORKFLOW_COMPLETED") == 1 and types.count("STEP_COMPLETED") == 1
        deliveries = await pool.fetchval(
            "SELECT count(*) FROM webhook_deliveries WHERE payload->'data'->>'workflowRunId' = $1", run_id
        )
        assert deliveries == 1
        executions = await pool.fetchval(
            "SELECT sum(e.executions) FROM test_side_effects e JOIN step_runs s "
            "ON e.idempotency_key = 'task:' || s.id WHERE s.workflow_run_id = $1",
            run_id,
        )
        # an ending committed before the kill is not run again; one lost with the kill may be
        assert executions == 1 if run_id in ended else executions in (1, 2)
