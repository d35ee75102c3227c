"""Signals, approvals, timeouts, cancel, retry, pause, skips and leases, on real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stevora.db.transitions import claim
from stevora.engine import commands
from stevora.engine.run_pool import RunPool
from stevora.engine.steps.approval import decide_approval
from stevora.errors import ConflictError, InvalidStateTransition, NotFoundError
from tests.conftest import Harness, create_definition


async def _define(harness: Harness, ws: str, *steps: dict[str, Any]) -> str:
    return await create_definition(
        harness.rt, ws, {"name": "t", "version": str(id(steps)), "steps": list(steps)}
    )


async def _current_step(harness: Harness, run_id: str) -> Any:
    return await harness.rt.pool.fetchrow(
        "SELECT s.* FROM step_runs s JOIN workflow_runs r ON r.current_step_run_id = s.id WHERE r.id = $1",
        run_id,
    )


async def test_external_event_signal_merges_payload_into_state_and_continues(
    harness: Harness, workspace_id: str
) -> None:
    seen: list[Any] = []
    harness.tasks.register("after", lambda ctx: seen.append(dict(ctx.workflow_state)))
    def_id = await _define(
        harness,
        workspace_id,
        {"type": "external_event", "name": "pay", "signalType": "payment_confirmed"},
        {"type": "task", "name": "after", "handler": "after"},
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    await harness.wait_for_status(run["id"], "WAITING")
    with pytest.raises(ConflictError) as mismatch:
        await commands.resume_run(harness.rt, workspace_id, run["id"], "other_signal", {})
    assert mismatch.value.code == "SIGNAL_MISMATCH"
    await commands.resume_run(harness.rt, workspace_id, run["id"], "payment_confirmed", {"amount": 42})
    row = await harness.wait_for_status(run["id"], "COMPLETED")
    assert row["state"]["amount"] == 42 and seen == [{"amount": 42}]
    types = await harness.event_types(run["id"])
    paused = [e for e in await harness.events(run["id"]) if e["event_type"] == "WORKFLOW_PAUSED"]
    assert (
        paused[0]["payload"]["reason"] == "external_event"
        and paused[0]["payload"]["signalType"] == "payment_confirmed"
    )
    assert "WORKFLOW_RESUMED" in types


async def test_external_event_times_out_and_fails_the_run(harness: Harness, workspace_id: str) -> None:
    def_id = await _define(
        harness,
        workspace_id,
        {
            "type": "external_event",
            "name": "pay",
            "signalType": "s",
            "timeoutMs": 200,
            "retry": {"maxAttempts": 1},
        },
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "FAILED", timeout_s=10)
    assert row["error"]["code"] == "TIMEOUT"


async def test_approval_rejection_fails_the_run_and_missing_content_fails_fast(
    harness: Harness, workspace_id: str
) -> None:
    def_id = await _define(harness, workspace_id, {"type": "approval", "name": "ok", "contentKey": "draft"})
    missing, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(missing["id"], "FAILED")
    assert row["error"]["code"] == "APPROVAL_CONTENT_MISSING"

    harness.tasks.register("draft", lambda ctx: {"status": "completed", "stateUpdates": {"draft": {"t": 1}}})
    def2 = await _define(
        harness,
        workspace_id,
        {"type": "task", "name": "d", "handler": "draft"},
        {"type": "approval", "name": "ok", "contentKey": "draft", "timeoutMs": 60000},
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def2)
    await harness.wait_for_status(run["id"], "WAITING")
    apr = await harness.rt.pool.fetchrow(
        "SELECT * FROM approval_requests WHERE workflow_run_id = $1", run["id"]
    )
    assert apr["expires_at"] is not None and apr["content"] == {"t": 1}
    await decide_approval(harness.rt, workspace_id, apr["id"], "rejected", decided_by="bob")
    row = await harness.wait_for_status(run["id"], "FAILED")
    assert row["error"]["code"] == "APPROVAL_REJECTED"
    with pytest.raises(InvalidStateTransition):
        await decide_approval(harness.rt, workspace_id, apr["id"], "approved")


async def test_approval_expires_after_its_timeout(harness: Harness, workspace_id: str) -> None:
    harness.tasks.register("draft2", lambda ctx: {"status": "completed", "stateUpdates": {"draft": "x"}})
    def_id = await _define(
        harness,
        workspace_id,
        {"type": "task", "name": "d", "handler": "draft2"},
        {"type": "approval", "name": "ok", "contentKey": "draft", "timeoutMs": 200},
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "FAILED", timeout_s=10)
    assert row["error"]["code"] == "TIMEOUT"
    status = await harness.rt.pool.fetchval(
        "SELECT status FROM approval_requests WHERE workflow_run_id = $1", run["id"]
    )
    assert status == "EXPIRED"


async def test_wait_until_a_past_timestamp_fires_immediately(harness: Harness, workspace_id: str) -> None:
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    def_id = await _define(harness, workspace_id, {"type": "wait", "name": "w", "untilTimestamp": past})
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    await harness.wait_for_status(run["id"], "COMPLETED", timeout_s=5)


async def test_condition_jump_skips_the_steps_in_between(harness: Harness, workspace_id: str) -> None:
    ran: list[str] = []
    harness.tasks.register("mark", lambda ctx: ran.append(ctx.step_name))
    def_id = await _define(
        harness,
        workspace_id,
        {"type": "condition", "name": "c", "expression": "flag", "trueStep": "a", "falseStep": "c2"},
        {"type": "task", "name": "a", "handler": "mark"},
        {"type": "task", "name": "b", "handler": "mark"},
        {"type": "task", "name": "c2", "handler": "mark"},
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    await harness.wait_for_status(run["id"], "COMPLETED")
    assert ran == ["c2"]
    skipped = await harness.rt.pool.fetch(
        "SELECT step_name FROM step_runs WHERE workflow_run_id = $1 AND status = 'SKIPPED' ORDER BY step_index",
        run["id"],
    )
    assert [s["step_name"] for s in skipped] == ["a", "b"]
    assert (await harness.event_types(run["id"])).count("STEP_SKIPPED") == 2


async def test_unknown_handler_fails_without_retrying(harness: Harness, workspace_id: str) -> None:
    def_id = await _define(harness, workspace_id, {"type": "task", "name": "t", "handler": "does_not_exist"})
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "FAILED")
    assert row["error"]["code"] == "HANDLER_NOT_REGISTERED"
    assert "STEP_RETRYING" not in await harness.event_types(run["id"])


async def test_cancel_stops_a_waiting_run_and_terminal_runs_cannot_be_cancelled(
    harness: Harness, workspace_id: str
) -> None:
    def_id = await _define(harness, workspace_id, {"type": "wait", "name": "w", "durationMs": 60000})
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    await harness.wait_for_status(run["id"], "WAITING")
    await commands.cancel_run(harness.rt, workspace_id, run["id"])
    row = await harness.wait_for_status(run["id"], "CANCELLED")
    assert row["cancelled_at"] is not None
    step = await _current_step(harness, run["id"])
    assert step["status"] == "CANCELLED"
    with pytest.raises(InvalidStateTransition):
        await commands.cancel_run(harness.rt, workspace_id, run["id"])
    with pytest.raises(NotFoundError):
        await commands.cancel_run(harness.rt, "ws_other", run["id"])


async def test_cancelling_a_running_task_revokes_the_workers_lease(
    harness: Harness, workspace_id: str
) -> None:
    started = asyncio.Event()
    finished: list[bool] = []

    async def slow(ctx: Any) -> None:
        started.set()
        await asyncio.sleep(5)
        finished.append(True)

    harness.tasks.register("slow", slow)
    def_id = await _define(harness, workspace_id, {"type": "task", "name": "s", "handler": "slow"})
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    await asyncio.wait_for(started.wait(), 5)
    await commands.cancel_run(harness.rt, workspace_id, run["id"])
    for _ in range(100):  # the heartbeat (1 s in tests) notices and cancels the task
        if run["id"] not in harness.run_pool.active_run_ids:
            break
        await asyncio.sleep(0.05)
    assert run["id"] not in harness.run_pool.active_run_ids and not finished
    assert (await harness.event_types(run["id"]))[-1] == "WORKFLOW_CANCELLED"


async def test_retry_from_failed_reruns_the_failed_step_with_a_fresh_budget(
    harness: Harness, workspace_id: str
) -> None:
    attempts: list[int] = []

    def flaky(ctx: Any) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) == 1:
            raise RuntimeError("first time fails")

    harness.tasks.register("flaky1", flaky)
    def_id = await _define(
        harness, workspace_id, {"type": "task", "name": "t", "handler": "flaky1", "retry": {"maxAttempts": 1}}
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    await harness.wait_for_status(run["id"], "FAILED")
    with pytest.raises(InvalidStateTransition):
        await commands.resume_run(harness.rt, workspace_id, run["id"], "x", {})
    await commands.retry_run(harness.rt, workspace_id, run["id"])
    row = await harness.wait_for_status(run["id"], "COMPLETED")
    assert row["error"] is None and attempts == [1, 1]
    visits = await harness.rt.pool.fetch(
        "SELECT visit, status FROM step_runs WHERE workflow_run_id = $1 ORDER BY created_at", run["id"]
    )
    assert [(v["visit"], v["status"]) for v in visits] == [(1, "FAILED"), (2, "COMPLETED")]


async def test_pause_and_unpause(harness: Harness, workspace_id: str) -> None:
    gate = asyncio.Event()

    async def gated(ctx: Any) -> None:
        await gate.wait()

    harness.tasks.register("gated", gated)
    harness.tasks.register("after2", lambda ctx: None)
    def_id = await _define(
        harness,
        workspace_id,
        {"type": "task", "name": "g", "handler": "gated"},
        {"type": "task", "name": "a", "handler": "after2"},
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    await harness.wait_for_status(run["id"], "RUNNING")
    await commands.pause_run(harness.rt, workspace_id, run["id"])
    gate.set()
    await harness.wait_for_status(run["id"], "PAUSED")
    await asyncio.sleep(0.3)
    assert (
        await harness.rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", run["id"])
    ) == "PAUSED"
    await commands.resume_run(harness.rt, workspace_id, run["id"], None, None)
    await harness.wait_for_status(run["id"], "COMPLETED")


async def test_idempotency_key_returns_the_existing_run(harness: Harness, workspace_id: str) -> None:
    def_id = await _define(harness, workspace_id, {"type": "wait", "name": "w", "durationMs": 1})
    results = await asyncio.gather(
        *(commands.create_run(harness.rt, workspace_id, def_id, {}, "order-1") for _ in range(10))
    )
    assert sum(created for _, created in results) == 1
    assert len({r["id"] for r, _ in results}) == 1


async def test_a_run_is_claimed_by_one_worker_only(harness: Harness, workspace_id: str) -> None:
    executions: list[str] = []

    async def once(ctx: Any) -> None:
        executions.append(ctx.step_run_id)
        await asyncio.sleep(0.2)

    harness.tasks.register("once", once)
    def_id = await _define(harness, workspace_id, {"type": "task", "name": "o", "handler": "once"})
    other = RunPool(harness.rt, worker_id="other-worker")
    other.start()
    try:
        run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
        await asyncio.gather(
            *(p.submit(run["id"]) for p in (other, harness.run_pool, other, harness.run_pool))
        )
        await harness.wait_for_status(run["id"], "COMPLETED")
    finally:
        await other.close()
    assert len(executions) == 1


async def test_an_expired_lease_is_taken_over_and_the_run_finished(
    harness: Harness, workspace_id: str
) -> None:
    harness.tasks.register("noop", lambda ctx: None)
    def_id = await _define(harness, workspace_id, {"type": "task", "name": "n", "handler": "noop"})
    dispatcher_pool = harness.dispatcher.run_pool
    harness.dispatcher.run_pool = None  # nobody executes the dispatch: a "dead worker" claims it instead
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    assert await claim(harness.rt.pool, run["id"], "dead-worker", 0.2) is not None
    assert await claim(harness.rt.pool, run["id"], "someone-else", 5) is None  # leased
    harness.dispatcher.run_pool = dispatcher_pool
    from stevora.engine.sweep import sweep_once

    await asyncio.sleep(1.3)  # lease expired and past the undispatched grace period
    assert run["id"] in await sweep_once(harness.rt)
    await harness.wait_for_status(run["id"], "COMPLETED")
