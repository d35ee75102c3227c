"""Flow control with real claims and leases (the in-process run pool): a concurrency key never
has more runs started than its limit, queued runs start as slots free and can be cancelled, and
higher priorities are claimed first under a backlog (docs/flow-control.md)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from itertools import pairwise
from typing import Any

import pytest

from stevora.db import concurrency, runs
from stevora.engine import commands
from stevora.errors import ConflictError, ValidationError
from tests.conftest import Harness, create_definition

KEYED = {
    "name": "keyed",
    "version": "1",
    "concurrency": {"key": "{{input.customerId}}", "limit": 1},
    "steps": [
        {"type": "task", "name": "first", "handler": "work"},
        {"type": "task", "name": "second", "handler": "work"},
    ],
}


async def test_a_key_never_runs_twice_at_once_and_every_run_completes(
    harness: Harness, workspace_id: str
) -> None:
    running: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)

    async def work(ctx: Any) -> dict[str, Any]:
        key = ctx.workflow_input["customerId"]
        running[key] += 1
        most[key] = max(most[key], running[key])
        await asyncio.sleep(0.01)
        running[key] -= 1
        return {"status": "completed"}

    harness.tasks.register("work", work)
    def_id = await create_definition(harness.rt, workspace_id, KEYED)
    ids = [
        (await commands.create_run(harness.rt, workspace_id, def_id, {"customerId": f"c{i % 4}"}))[0]["id"]
        for i in range(24)
    ]
    for run_id in ids:
        await harness.wait_for_status(run_id, "COMPLETED", timeout_s=30)
    assert dict(most) == {f"c{k}": 1 for k in range(4)}
    # Counted again from the events: per key, no run starts before the previous one completed,
    # and the runs of one key start in the order they were created (FIFO).
    rows = await harness.rt.pool.fetch(
        "SELECT r.id, r.concurrency_key, r.created_at, "
        "  max(e.created_at) FILTER (WHERE e.event_type = 'WORKFLOW_STARTED') AS started, "
        "  max(e.created_at) FILTER (WHERE e.event_type = 'WORKFLOW_COMPLETED') AS ended "
        "FROM workflow_runs r JOIN workflow_events e ON e.workflow_run_id = r.id "
        "WHERE r.id = ANY($1::text[]) GROUP BY r.id ORDER BY r.concurrency_key, started",
        ids,
    )
    by_key: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_key[row["concurrency_key"]].append(row)
    assert len(by_key) == 4
    for runs_of_key in by_key.values():
        for before, after in pairwise(runs_of_key):
            assert after["started"] >= before["ended"]
        assert [r["created_at"] for r in runs_of_key] == sorted(r["created_at"] for r in runs_of_key)
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE id = ANY($1::text[]) AND queued_at IS NOT NULL", ids
        )
        == 0
    )


async def test_a_queued_run_is_visible_cancellable_and_the_next_starts_when_the_slot_frees(
    harness: Harness, workspace_id: str
) -> None:
    gate = asyncio.Event()

    async def work(ctx: Any) -> dict[str, Any]:
        await gate.wait()
        return {"status": "completed"}

    harness.tasks.register("work", work)
    def_id = await create_definition(harness.rt, workspace_id, KEYED)
    first, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"customerId": "acme"})
    await harness.wait_for_status(first["id"], "RUNNING")
    second, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"customerId": "acme"})
    third, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"customerId": "acme"})
    other, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"customerId": "globex"})
    await harness.wait_for_status(other["id"], "RUNNING")  # another key is not held up
    for queued in (second, third):
        for _ in range(200):
            row = await harness.rt.pool.fetchrow(
                "SELECT status, queued_at, lease_owner FROM workflow_runs WHERE id = $1", queued["id"]
            )
            if row["queued_at"] is not None:
                break
            await asyncio.sleep(0.02)
        # Queued: PENDING, holding no lease (nor a worker task).
        assert (row["status"], row["lease_owner"]) == ("PENDING", None)
        assert row["queued_at"] is not None
        assert queued["id"] not in harness.run_pool.active_run_ids
    assert await concurrency.queue_position(harness.rt.pool, second["id"]) == 1
    assert await concurrency.queue_position(harness.rt.pool, third["id"]) == 2

    cancelled = await commands.cancel_run(harness.rt, workspace_id, second["id"])
    assert cancelled["status"] == "CANCELLED"
    assert await concurrency.queue_position(harness.rt.pool, third["id"]) == 1
    gate.set()
    for run in (first, third, other):
        await harness.wait_for_status(run["id"], "COMPLETED")
    assert (await harness.wait_for_status(second["id"], "CANCELLED"))["started_at"] is None


async def test_a_key_that_reads_a_missing_input_field_is_refused(harness: Harness, workspace_id: str) -> None:
    def_id = await create_definition(harness.rt, workspace_id, KEYED)
    with pytest.raises(ValidationError) as err:
        await commands.create_run(harness.rt, workspace_id, def_id, {"customer": "x"})
    assert err.value.details["errors"][0]["path"] == "input.customerId"
    assert (
        await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs WHERE definition_id = $1", def_id)
        == 0
    )


async def test_under_a_backlog_higher_priority_runs_start_first_and_the_lowest_still_start(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = asyncio.Event()
    started: list[int] = []

    async def work(ctx: Any) -> dict[str, Any]:
        if ctx.workflow_input.get("blocker"):
            await gate.wait()
        else:
            started.append(ctx.workflow_input["priority"])
        return {"status": "completed"}

    harness.tasks.register("work", work)
    # One run at a time in this worker: everything behind the blocker is a backlog.
    harness.run_pool._slots = asyncio.Semaphore(1)
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {"name": "prio", "version": "1", "steps": [{"type": "task", "name": "t", "handler": "work"}]},
    )
    blocker, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"blocker": True})
    await harness.wait_for_status(blocker["id"], "RUNNING")
    ids = []
    for priority in [0, 0, 0, 5, 5, 9]:
        run, _ = await commands.create_run(
            harness.rt, workspace_id, def_id, {"priority": priority}, priority=priority
        )
        ids.append(run["id"])
    gate.set()
    for run_id in ids:
        await harness.wait_for_status(run_id, "COMPLETED", timeout_s=30)
    assert started == [9, 5, 5, 0, 0, 0]


async def test_aging_a_long_waiting_low_priority_run_is_no_longer_outranked(
    harness: Harness, workspace_id: str
) -> None:
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {"name": "aging", "version": "1", "steps": [{"type": "task", "name": "t", "handler": "work"}]},
    )
    pool = harness.rt.pool
    old = await runs.insert_run(
        pool, workspace_id=workspace_id, definition_id=def_id, input={}, idempotency_key=None
    )
    fresh = await runs.insert_run(
        pool, workspace_id=workspace_id, definition_id=def_id, input={}, idempotency_key=None
    )
    await runs.insert_run(
        pool,
        workspace_id=workspace_id,
        definition_id=def_id,
        input={},
        idempotency_key=None,
        flow=runs.FlowColumns(priority=9),
    )
    assert old is not None and fresh is not None
    # Waited 11 minutes at priority 0: effective 11 > 9 (one point per minute).
    await pool.execute(
        "UPDATE workflow_runs SET created_at = now() - interval '11 minutes' WHERE id = $1", old["id"]
    )
    assert (await concurrency.inspect(pool, fresh["id"]))["outranked"] is True
    assert (await concurrency.inspect(pool, old["id"]))["outranked"] is False


async def test_retrying_a_failed_keyed_run_takes_a_slot_or_is_a_conflict(
    harness: Harness, workspace_id: str
) -> None:
    gate = asyncio.Event()

    async def work(ctx: Any) -> dict[str, Any]:
        if ctx.workflow_input.get("fail") and ctx.workflow_state.get("retried") is None:
            raise RuntimeError("boom")
        await gate.wait()
        return {"status": "completed"}

    harness.tasks.register("work", work)
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "retry-keyed",
            "version": "1",
            "concurrency": {"key": "{{input.customerId}}", "limit": 1},
            "steps": [{"type": "task", "name": "t", "handler": "work", "retry": {"maxAttempts": 1}}],
        },
    )
    failing, _ = await commands.create_run(
        harness.rt, workspace_id, def_id, {"customerId": "a", "fail": True}
    )
    await harness.wait_for_status(failing["id"], "FAILED")
    holder, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"customerId": "a"})
    await harness.wait_for_status(holder["id"], "RUNNING")
    with pytest.raises(ConflictError) as err:
        await commands.retry_run(harness.rt, workspace_id, failing["id"])
    assert err.value.details["concurrencyKey"] == "a"
    assert (await harness.wait_for_status(failing["id"], "FAILED"))["status"] == "FAILED"
    gate.set()
    await harness.wait_for_status(holder["id"], "COMPLETED")
    retried = await commands.retry_run(harness.rt, workspace_id, failing["id"])
    assert retried["status"] == "RUNNING"


async def test_a_run_that_waited_for_its_keys_lock_is_dated_after_the_ending_whose_slot_it_took(
    harness: Harness, workspace_id: str
) -> None:
    """A slot claim's transaction begins before it waits for its key's lock: the run it starts is
    dated when the claim took effect, not when its transaction began, so the timeline never shows
    a run of a key starting before the one whose slot it took had ended."""
    gate = asyncio.Event()

    async def work(ctx: Any) -> dict[str, Any]:
        if ctx.workflow_input.get("hold"):
            await gate.wait()
        return {"status": "completed"}

    harness.tasks.register("work", work)
    def_id = await create_definition(harness.rt, workspace_id, KEYED)
    first, _ = await commands.create_run(
        harness.rt, workspace_id, def_id, {"customerId": "acme", "hold": True}
    )
    await harness.wait_for_status(first["id"], "RUNNING")
    async with harness.rt.pool.acquire() as blocker, blocker.transaction():
        # Another decider holds the key's lock: the next run's claim begins and waits for it.
        await concurrency.lock_slots(blocker, workspace_id, "acme", False)
        second, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"customerId": "acme"})
        await harness.value_when_set(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid <> $1 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            blocker.get_server_pid(),
        )
        gate.set()  # the first run ends while that claim is waiting
        await harness.wait_for_status(first["id"], "COMPLETED")
    second_row = await harness.wait_for_status(second["id"], "RUNNING", "COMPLETED")
    dated = {
        (e["workflow_run_id"], e["event_type"]): e["created_at"]
        for e in await harness.rt.pool.fetch(
            "SELECT workflow_run_id, event_type, created_at FROM workflow_events WHERE workflow_run_id = ANY($1)",
            [first["id"], second["id"]],
        )
    }
    ended = dated[(first["id"], "WORKFLOW_COMPLETED")]
    assert dated[(second["id"], "WORKFLOW_STARTED")] >= ended
    assert dated[(second["id"], "STEP_STARTED")] >= ended
    assert second_row["started_at"] >= ended
