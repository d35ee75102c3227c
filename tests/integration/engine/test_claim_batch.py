"""Claims of concurrent submits in one statement (`stevora.engine.claim_batch`,
`transitions.claim_batch`): each run keeps its own fence, a PENDING run is started with its step
run and two events, a refused run goes on through flow control, and a lost connection is retried
with the outcome-unknown check."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from stevora.db import transitions
from stevora.engine import commands
from stevora.engine.claim_batch import ClaimBatcher
from stevora.engine.run_pool import RunPool
from stevora.ids import new_id
from tests.conftest import Harness, create_definition

OWNER = "test-worker"


async def _pending_runs(
    harness: Harness,
    workspace_id: str,
    n: int,
    spec: dict[str, Any] | None = None,
    inputs: list[dict[str, Any]] | None = None,
) -> list[str]:
    """`n` PENDING runs nobody executes (the in-process dispatcher has its pool detached); their
    handler `ok` is the test's to register."""
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        spec
        or {
            "name": "batched",
            "version": new_id("v"),
            "steps": [{"type": "task", "name": "s0", "handler": "ok"}],
        },
    )
    pool, harness.dispatcher.run_pool = harness.dispatcher.run_pool, None
    try:
        return [
            str(
                (await commands.create_run(harness.rt, workspace_id, def_id, (inputs or [{}] * n)[i]))[0][
                    "id"
                ]
            )
            for i in range(n)
        ]
    finally:
        harness.dispatcher.run_pool = pool


class _CountingPool:
    """The pool, with the statements sent through it counted."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.statements = 0

    async def fetch(self, *args: Any) -> Any:
        self.statements += 1
        return await self.pool.fetch(*args)

    async def fetchrow(self, *args: Any) -> Any:
        self.statements += 1
        return await self.pool.fetchrow(*args)


async def _started(pool: asyncpg.Pool, run_id: str) -> dict[str, Any]:
    run = await pool.fetchrow("SELECT * FROM workflow_runs WHERE id = $1", run_id)
    steps = await pool.fetch("SELECT * FROM step_runs WHERE workflow_run_id = $1", run_id)
    events = await pool.fetch(
        "SELECT event_type, sequence, step_run_id, created_at FROM workflow_events "
        "WHERE workflow_run_id = $1 ORDER BY sequence",
        run_id,
    )
    return {"run": run, "steps": steps, "events": events}


@pytest.fixture(autouse=True)
def _handler(harness: Harness) -> None:
    harness.tasks.register("ok", lambda ctx: {"ok": True})


async def test_one_statement_starts_several_pending_runs_each_with_its_step_run_and_events(
    harness: Harness, workspace_id: str
) -> None:
    ids = await _pending_runs(harness, workspace_id, 5)
    claimed = await transitions.claim_batch(harness.rt.pool, sorted(ids), OWNER, 60)

    assert set(claimed) == set(ids)
    for run_id in ids:
        row, step = claimed[run_id]
        assert row["status"] == "RUNNING" and row["lease_owner"] == OWNER and row["started"]
        assert step is not None and step["workflow_run_id"] == run_id and step["status"] == "RUNNING"
        got = await _started(harness.rt.pool, run_id)
        assert got["run"]["current_step_run_id"] == step["id"] and got["run"]["event_seq"] == 2
        assert [s["id"] for s in got["steps"]] == [step["id"]]
        assert [(e["event_type"], e["sequence"], e["step_run_id"]) for e in got["events"]] == [
            ("WORKFLOW_STARTED", 1, None),
            ("STEP_STARTED", 2, step["id"]),
        ]
        assert got["events"][0]["created_at"] == got["run"]["started_at"] == step["started_at"]


async def test_a_run_locked_elsewhere_is_skipped_by_the_batch_without_waiting(
    harness: Harness, workspace_id: str
) -> None:
    """The batch locks its runs in id order and skips a run another transaction holds (a
    duplicate claim, a cancel): the others are claimed at once, the held one is refused (its
    caller claims it alone, waiting for the lock there) instead of stalling the whole batch."""
    ids = sorted(await _pending_runs(harness, workspace_id, 3))
    async with harness.rt.pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR NO KEY UPDATE", ids[1])
        claimed = await asyncio.wait_for(transitions.claim_batch(harness.rt.pool, ids, OWNER, 60), 10)
    assert set(claimed) == {ids[0], ids[2]}
    assert (await _started(harness.rt.pool, ids[1]))["run"]["status"] == "PENDING"
    assert set(await transitions.claim_batch(harness.rt.pool, [ids[1]], OWNER, 60)) == {ids[1]}


async def test_runs_the_fence_refuses_are_left_alone_while_the_rest_are_claimed(
    harness: Harness, workspace_id: str
) -> None:
    """Leased by another worker, finished, not due yet: refused, nothing written for them; an
    expired lease is taken over and counted as its holder's crash."""
    free, other, ended, later, expired = await _pending_runs(harness, workspace_id, 5)
    pool = harness.rt.pool
    assert await transitions.claim(pool, other, "someone-else", 60) is not None
    assert await transitions.claim(pool, expired, "dead-worker", 0.01) is not None
    await pool.execute(
        "UPDATE workflow_runs SET status = 'COMPLETED', completed_at = now() WHERE id = $1", ended
    )
    await pool.execute(
        "UPDATE workflow_runs SET next_run_at = now() + interval '1 hour' WHERE id = $1", later
    )
    before = {r: await _started(pool, r) for r in (other, ended, later)}
    await asyncio.sleep(0.05)  # the dead worker's lease expires

    claimed = await transitions.claim_batch(pool, sorted([free, other, ended, later, expired]), OWNER, 60)

    assert set(claimed) == {free, expired}
    assert claimed[free][1] is not None  # started
    assert claimed[expired][1] is None  # taken over, not started again
    assert claimed[expired][0]["crash_count"] == 1 and claimed[free][0]["crash_count"] == 0
    for run_id, was in before.items():
        now = await _started(pool, run_id)
        assert dict(now["run"]) == dict(was["run"]) and len(now["events"]) == len(was["events"])


async def test_concurrent_submits_share_one_statement(harness: Harness, workspace_id: str) -> None:
    ids = await _pending_runs(harness, workspace_id, 12)
    counting = _CountingPool(harness.rt.pool)
    batcher = ClaimBatcher(counting, OWNER, 60)  # type: ignore[arg-type]

    got = await asyncio.gather(*(batcher.claim(r) for r in ids))

    assert counting.statements == 1 and batcher.batches == 1 and batcher.rows == 12
    assert all(isinstance(g, tuple) and g[1] is not None for g in got)
    for run_id, (row, _step) in zip(ids, got, strict=True):  # type: ignore[misc]
        assert row["id"] == run_id
    # A lone claim is today's single-run statement.
    [alone] = await _pending_runs(harness, workspace_id, 1)
    one = await batcher.claim(alone)
    assert counting.statements == 2 and batcher.batches == 1 and isinstance(one, tuple)


async def test_the_same_run_twice_among_concurrent_submits_is_started_once(
    harness: Harness, workspace_id: str
) -> None:
    ids = await _pending_runs(harness, workspace_id, 3)
    done = asyncio.Event()

    async def blocked(ctx: Any) -> dict[str, Any]:
        await done.wait()
        return {"ok": True}

    harness.tasks.register("ok", blocked)
    counting = _CountingPool(harness.rt.pool)
    batcher = ClaimBatcher(counting, OWNER, 60)  # type: ignore[arg-type]
    twice = ids[0]
    got = await asyncio.gather(*(batcher.claim(r) for r in [twice, ids[1], twice, ids[2]]))

    assert [isinstance(g, tuple) for g in got] == [True, True, False, True]  # the second: refused
    assert batcher.batches == 1 and batcher.rows == 3 and counting.statements == 2
    # Through the run pool: submitted twice at once, it runs once.
    [again] = await _pending_runs(harness, workspace_id, 1)
    submitted = await asyncio.gather(*(harness.run_pool.submit(r) for r in [again, again]))
    assert sorted(submitted) == [False, True]
    got_again = await _started(harness.rt.pool, again)
    assert len(got_again["steps"]) == 1 and len(got_again["events"]) == 2
    done.set()
    await harness.wait_for_status(again, "COMPLETED")


async def test_a_run_needing_a_slot_or_outranked_still_goes_through_flow_control(
    harness: Harness, workspace_id: str
) -> None:
    """Submitted at once with plain runs: the second run of a key of limit 1 is queued; then a
    plain run that an unclaimed run of higher priority outranks has that run claimed instead."""
    gate = asyncio.Event()

    async def work(ctx: Any) -> dict[str, Any]:
        await gate.wait()
        return {"ok": True}

    harness.tasks.register("ok", work)
    keyed = {
        "name": "keyed-batch",
        "version": new_id("v"),
        "concurrency": {"key": "{{input.customerId}}", "limit": 1},
        "steps": [{"type": "task", "name": "s0", "handler": "ok"}],
    }
    first, second = await _pending_runs(harness, workspace_id, 2, keyed, [{"customerId": "c1"}] * 2)
    plain = await _pending_runs(harness, workspace_id, 3)
    pool = harness.rt.pool
    rp = harness.run_pool

    results = await asyncio.gather(*(rp.submit(r) for r in [first, second, *plain]))

    assert rp.claims.batches == 1 and rp.claims.rows == 5
    assert results == [True, False, True, True, True]

    async def row(run_id: str) -> asyncpg.Record:
        return await pool.fetchrow(
            "SELECT status, queued_at, lease_owner FROM workflow_runs WHERE id = $1", run_id
        )

    assert (await row(first))["status"] == "RUNNING"
    assert (await row(second))["status"] == "PENDING" and (await row(second))["queued_at"] is not None
    assert [(await row(r))["status"] for r in plain] == ["RUNNING"] * 3

    ranked = {
        "name": "ranked-batch",
        "version": new_id("v"),
        "priority": 5,
        "steps": [{"type": "task", "name": "s0", "handler": "ok"}],
    }
    [better] = await _pending_runs(harness, workspace_id, 1, ranked)
    low = await _pending_runs(harness, workspace_id, 2)
    results = await asyncio.gather(*(rp.submit(r) for r in low))

    assert rp.claims.batches == 2 and results == [True, True]
    assert (await row(better))["status"] == "RUNNING"  # claimed in the stead of one of them
    gate.set()
    for run_id in [first, second, *plain, better, *low]:
        assert (await harness.wait_for_status(run_id, "COMPLETED", "FAILED"))["status"] == "COMPLETED"


async def test_a_batch_whose_outcome_was_unknown_still_starts_every_run_once(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement committed and the connection died before its answer: the retry finds the
    runs leased by this worker (refused), and each caller's check finds them its own."""
    real = transitions.claim_batch
    tries: list[int] = []

    async def commit_then_drop(pool: asyncpg.Pool, run_ids: list[str], owner: str, lease_s: float) -> Any:
        tries.append(len(run_ids))
        got = await real(pool, run_ids, owner, lease_s)
        if len(tries) == 1:
            raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
        return got

    monkeypatch.setattr(transitions, "claim_batch", commit_then_drop)
    ids = await _pending_runs(harness, workspace_id, 4)

    results = await asyncio.gather(*(harness.run_pool.submit(r) for r in ids))

    assert results == [True] * 4 and tries == [4, 4]
    for run_id in ids:
        assert (await harness.wait_for_status(run_id, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
        got = await _started(harness.rt.pool, run_id)
        assert len(got["steps"]) == 1
        assert [e["event_type"] for e in got["events"]].count("WORKFLOW_STARTED") == 1


async def test_a_batch_that_fails_for_one_runs_reason_sends_each_run_alone(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: Any) -> Any:
        raise asyncpg.DataError("one run's bad data")

    monkeypatch.setattr(transitions, "claim_batch", broken)
    ids = await _pending_runs(harness, workspace_id, 3)

    results = await asyncio.gather(*(harness.run_pool.submit(r) for r in ids))

    assert results == [True] * 3
    for run_id in ids:
        assert (await harness.wait_for_status(run_id, "COMPLETED", "FAILED"))["status"] == "COMPLETED"


def _join_filter_rows(plan: dict[str, Any]) -> int:
    return int(plan.get("Rows Removed by Join Filter", 0)) + sum(
        _join_filter_rows(p) for p in plan.get("Plans", [])
    )


async def test_the_batch_claim_does_linear_work_in_its_runs(harness: Harness, workspace_id: str) -> None:
    """No join of the statement compares every run with every other (as a nested loop over the
    CTEs would): under EXPLAIN ANALYZE, rolled back, fewer rows thrown away than the batch holds."""
    ids = sorted(await _pending_runs(harness, workspace_id, 16))
    n = len(ids)
    async with harness.rt.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            explained = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + transitions._BATCH_CLAIM_SQL,
                ids,
                OWNER,
                60,
                {r: [new_id("srun"), new_id("evt"), new_id("evt")] for r in ids},
            )
            events = await conn.fetchval(
                "SELECT count(*) FROM workflow_events WHERE workflow_run_id = ANY($1::text[])", ids
            )
        finally:
            await tx.rollback()
    plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]
    assert plan["Plan"]["Actual Rows"] == n and events == 2 * n
    assert _join_filter_rows(plan["Plan"]) < n


async def test_claims_in_flight_when_the_pool_closes_leave_no_run_leased_to_it(
    harness: Harness, workspace_id: str
) -> None:
    """`close` waits for the claims in flight: runs they claimed are not started but handed back
    with the other leases, so none stays leased to a closed worker until its lease expires."""
    ids = await _pending_runs(harness, workspace_id, 5)
    closing = RunPool(harness.rt, worker_id="closing-worker")
    submits = [asyncio.ensure_future(closing.submit(r)) for r in ids]
    await asyncio.sleep(0)  # every submit has queued its claim
    await closing.close()
    assert await asyncio.gather(*submits) == [False] * 5
    assert closing.active_run_ids == []
    leased = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE lease_owner = 'closing-worker'"
    )
    assert leased == 0


async def test_a_run_claimed_while_the_pool_closes_is_handed_back_at_once(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that commits after `close` began (one through flow control, which `close` does not
    wait for) is not started and its lease is handed back at once, not left to expire; a submit
    that arrives while the pool closes claims nothing."""
    first, second = await _pending_runs(harness, workspace_id, 2)
    closing = RunPool(harness.rt, worker_id="closing-worker")
    claim = closing._claim

    async def claim_as_close_begins(run_id: str) -> Any:
        got = await claim(run_id)
        closing._closing = True  # close() began while this claim was on the wire
        return got

    monkeypatch.setattr(closing, "_claim", claim_as_close_begins)
    assert await closing.submit(first) is False
    assert await closing.submit(second) is False
    assert closing.active_run_ids == []
    owners = await harness.rt.pool.fetch(
        "SELECT id, lease_owner, status FROM workflow_runs WHERE id = ANY($1::text[])", [first, second]
    )
    assert all(r["lease_owner"] != "closing-worker" for r in owners), owners
    assert next(r for r in owners if r["id"] == second)["status"] == "PENDING"  # never claimed
