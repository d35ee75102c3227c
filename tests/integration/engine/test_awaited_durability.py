"""A run waiting for tool outputs holds nothing: no lease, no task, no thread. It survives a worker
restart and a wait of days (simulated by moving the stored clock back), then times out or resumes."""

from __future__ import annotations

import asyncio

from stevora.db.runs import RUNNABLE
from stevora.engine import commands
from stevora.engine.run_pool import RunPool
from stevora.engine.steps.awaited import client as tool_outputs
from tests.conftest import Harness, create_definition

DAY_MS = 24 * 3600 * 1000


def client_tool(name: str, timeout_ms: int) -> dict[str, object]:
    return {
        "name": name,
        "description": f"{name} (answered by the caller)",
        "parameters": {"type": "object", "properties": {}},
        "execution": "client",
        "timeoutMs": timeout_ms,
    }


async def move_clock(harness: Harness, run_id: str, by: str) -> None:
    """Make every stored time of the run `by` older: as if that much time had passed."""
    pool = harness.rt.pool
    await pool.execute(
        f"UPDATE awaited_tool_calls SET deadline_at = deadline_at - interval '{by}', created_at = created_at - interval '{by}' "
        "WHERE workflow_run_id = $1",
        run_id,
    )
    await pool.execute(
        f"UPDATE step_runs SET wait_until = wait_until - interval '{by}' WHERE workflow_run_id = $1", run_id
    )
    await pool.execute(
        f"UPDATE workflow_runs SET next_run_at = next_run_at - interval '{by}', dispatched_at = NULL WHERE id = $1",
        run_id,
    )


async def test_a_two_day_wait_survives_a_worker_restart_then_times_out_one_call_and_resumes_on_the_other(
    harness: Harness, workspace_id: str
) -> None:
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "slow-human",
            "version": "1",
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "model": "scripted",
                    "messages": [{"role": "user", "content": "go"}],
                    "tools": [
                        client_tool("sign_contract", 2 * DAY_MS),
                        client_tool("pay_invoice", 3 * DAY_MS),
                    ],
                }
            ],
        },
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    waiting = await harness.wait_for_status(run["id"], "WAITING")
    # Waiting holds nothing: no lease, no task in the pool; the next wake-up is the first deadline.
    assert waiting["lease_owner"] is None
    await harness.run_pool.wait_idle(5)
    assert harness.run_pool.active_run_ids == []
    delta = waiting["next_run_at"] - waiting["updated_at"]
    assert abs(delta.total_seconds() - 2 * 86400) < 60

    # The worker restarts (a new process would have a new pool and a new owner id).
    await harness.run_pool.close()
    restarted = RunPool(harness.rt)
    harness.dispatcher.run_pool = restarted
    harness.run_pool = restarted
    restarted.start()

    # Two days pass: the run is due (the claim's predicate is the sweep's), the new worker times
    # the first call out. (Dispatched directly: a sweep would also pick up other tests' runs.)
    await move_clock(harness, run["id"], "2 days 1 second")
    assert await harness.rt.pool.fetchval(
        f"SELECT count(*) FROM workflow_runs WHERE id = $1 AND {RUNNABLE}", run["id"]
    )
    await harness.dispatcher.dispatch(run["id"])
    for _ in range(250):
        row = await harness.rt.pool.fetchrow(
            "SELECT status, error_code FROM tool_trace WHERE workflow_run_id = $1 AND tool_name = 'sign_contract'",
            run["id"],
        )
        if row is not None:
            break
        await asyncio.sleep(0.02)
    assert row is not None and row["status"] == "failed" and row["error_code"] == "TOOL_OUTPUT_TIMEOUT"
    for _ in range(250):  # the worker hands the run back once it has nothing to do
        still = await harness.wait_for_status(run["id"], "WAITING")
        if still["lease_owner"] is None:
            break
        await asyncio.sleep(0.02)
    assert still["lease_owner"] is None and still["next_run_at"] is not None  # the other call's deadline

    # A day later the person answers the other call: the run resumes on the restarted worker.
    call_id = await harness.rt.pool.fetchval(
        "SELECT tool_call_id FROM awaited_tool_calls WHERE workflow_run_id = $1 AND status = 'pending'",
        run["id"],
    )
    await tool_outputs.submit_tool_outputs(
        harness.rt, workspace_id, run["id"], [tool_outputs.ToolOutput(call_id, output={"paid": True})]
    )
    done = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED"
    types = await harness.event_types(run["id"])
    assert types.count("TOOL_CALL_FAILED") == 1 and types.count("TOOL_CALL_COMPLETED") == 1
    assert types.count("LLM_CALL_COMPLETED") == 2
