"""Runs that end together share one statement (group commit's third kind of row): each run's last
step and run completed with its events and webhook outbox rows, each row under its own guards,
and a lost connection retried without writing anything twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from stevora.db import checkpoints, transitions
from stevora.db.checkpoint_sql import PAIR_SQL
from stevora.db.group_commit import GroupCommitter
from stevora.errors import InvalidStateTransition, LeaseLost
from stevora.faults import FaultPlan
from tests.conftest import Harness
from tests.integration.db.test_group_commit import OWNER as GC_OWNER
from tests.integration.db.test_group_commit import _join_filter_rows, leased, model_call, record_trace
from tests.integration.engine.test_db_outage import CommitThenDrop, kill_the_next_writer
from tests.integration.engine.test_fixed_path import OWNER, _snapshot, _started_run, _subscribe


class CountingPool:
    """The pool, counting the completion statements sent on it (a batch's or a lone row's)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.completions: list[str] = []

    async def fetch(self, sql: str, *args: Any) -> Any:
        if sql in (transitions.COMPLETION.batch_sql, transitions.COMPLETION.single_sql):
            self.completions.append("batch" if sql == transitions.COMPLETION.batch_sql else "single")
        return await self.pool.fetch(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self.pool.fetchval(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        return await self.pool.fetchrow(sql, *args)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[CountingPool]:
        """A statement with crash points goes on an acquired connection: this pool again."""
        yield self


class RecordingFaults(FaultPlan):
    """The crash points reached, recorded instead of killing the process."""

    def __init__(self) -> None:
        super().__init__("batch_committed")  # armed
        self.seen: list[tuple[object, ...]] = []

    def reached(self, point: str, *args: object) -> None:
        self.seen.append((point, *args))


async def _started(harness: Harness, workspace_id: str, n: int) -> list[tuple[str, str]]:
    return [await _started_run(harness, workspace_id) for _ in range(n)]


async def _complete_all(db: Any, started: list[tuple[str, str]]) -> list[Any]:
    return await asyncio.gather(
        *(
            transitions.complete_last_step(db, run_id, step_run_id, OWNER, {"n": n}, {"done": n})
            for n, (run_id, step_run_id) in enumerate(started)
        ),
        return_exceptions=True,
    )


async def _deliveries(pool: asyncpg.Pool, run_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT * FROM webhook_deliveries WHERE payload->'data'->>'workflowRunId' = $1", run_id
    )


async def test_runs_ending_together_share_one_statement_each_with_its_events_outbox_rows_and_final_row(
    harness: Harness, workspace_id: str
) -> None:
    hook = await _subscribe(harness, workspace_id, ["workflow.completed"])
    started = await _started(harness, workspace_id, 4)
    pool = harness.rt.pool
    await pool.execute(
        "UPDATE workflow_runs SET state = '{\"kept\": 1}', total_cost_cents = 1.5 WHERE id = $1",
        started[0][0],
    )
    counting = CountingPool(pool)
    faults = RecordingFaults()
    gc = GroupCommitter(counting, faults=faults)  # type: ignore[arg-type]

    finals = await _complete_all(gc, started)

    assert counting.completions == ["batch"] and gc.batches == 1 and gc.rows == 4
    # the crash points of a statement carrying several runs' rows, as for checkpoints
    assert [s for s in faults.seen if s[0].startswith("batch_")] == [  # type: ignore[union-attr]
        ("batch_sending", "completion", 1),
        ("batch_sent", "completion", 1),
        ("batch_committed", "completion", 1),
    ]
    for n, ((run_id, step_run_id), final) in enumerate(zip(started, finals, strict=True)):
        assert not isinstance(final, BaseException), final
        assert (final["id"], final["status"], final["lease_owner"]) == (run_id, "COMPLETED", None)
        expected_state = {"kept": 1, "done": 0} if n == 0 else {"done": n}
        assert final["state"] == final["output"] == expected_state
        assert final["event_seq"] == 4 and final["s_step_name"] == "s0"
        step = await pool.fetchrow(
            "SELECT status, output, state_updates FROM step_runs WHERE id = $1", step_run_id
        )
        assert (step["status"], step["output"], step["state_updates"]) == ("COMPLETED", {"n": n}, {"done": n})
        events = await harness.events(run_id)
        assert [(e["sequence"], e["event_type"], e["step_run_id"]) for e in events] == [
            (1, "WORKFLOW_STARTED", None),
            (2, "STEP_STARTED", step_run_id),
            (3, "STEP_COMPLETED", step_run_id),
            (4, "WORKFLOW_COMPLETED", None),
        ]
        assert events[2]["payload"]["stepName"] == "s0" and events[2]["payload"]["durationMs"] >= 0
        deliveries = await _deliveries(pool, run_id)
        assert [(d["webhook_id"], d["event"], d["status"]) for d in deliveries] == [
            (hook, "workflow.completed", "PENDING")
        ]
        payload = deliveries[0]["payload"]
        assert payload["id"].startswith("whevt") and payload["event"] == "workflow.completed"
        assert payload["data"] == {
            "workflowRunId": run_id,
            "status": "COMPLETED",
            "output": expected_state,
            "totalCostCents": 1.5 if n == 0 else 0,
        }


async def test_a_lost_lease_in_a_batch_fails_only_its_caller_and_writes_nothing_of_its(
    harness: Harness, workspace_id: str
) -> None:
    await _subscribe(harness, workspace_id, ["workflow.completed"])
    started = await _started(harness, workspace_id, 4)
    pool = harness.rt.pool
    lost, paused = started[1][0], started[2][0]
    await pool.execute("UPDATE workflow_runs SET lease_owner = 'taken-over' WHERE id = $1", lost)
    await pool.execute("UPDATE workflow_runs SET status = 'PAUSED' WHERE id = $1", paused)
    before = {run_id: await _snapshot(harness, run_id) for run_id in (lost, paused)}
    counting = CountingPool(pool)
    gc = GroupCommitter(counting)  # type: ignore[arg-type]

    results = await _complete_all(gc, started)

    assert counting.completions == ["batch"]
    assert isinstance(results[1], LeaseLost) and isinstance(results[2], LeaseLost)
    assert "no longer leased by this worker" in str(results[1])  # the message the single path gives
    for i in (0, 3):
        assert results[i]["status"] == "COMPLETED"
        assert await harness.event_types(started[i][0]) == [
            "WORKFLOW_STARTED",
            "STEP_STARTED",
            "STEP_COMPLETED",
            "WORKFLOW_COMPLETED",
        ]
    for run_id in (lost, paused):
        after = await _snapshot(harness, run_id)
        assert after == before[run_id]
        assert after["steps"][0]["status"] == "RUNNING" and after["deliveries"] == 0


async def test_a_step_no_longer_running_in_a_batch_gives_its_caller_invalid_state_transition(
    harness: Harness, workspace_id: str
) -> None:
    started = await _started(harness, workspace_id, 3)
    pool = harness.rt.pool
    run_id, step_run_id = started[1]
    await pool.execute("UPDATE step_runs SET status = 'FAILED' WHERE id = $1", step_run_id)
    before = await _snapshot(harness, run_id)
    gc = GroupCommitter(CountingPool(pool))  # type: ignore[arg-type]

    results = await _complete_all(gc, started)

    assert isinstance(results[1], InvalidStateTransition)
    assert results[0]["status"] == results[2]["status"] == "COMPLETED"
    assert gc.batches == 1
    assert await _snapshot(harness, run_id) == before


async def test_a_batch_whose_connection_is_killed_in_flight_is_retried_and_nothing_doubles(
    harness: Harness, workspace_id: str, database_url: str
) -> None:
    await _subscribe(harness, workspace_id, ["workflow.completed"])
    started = await _started(harness, workspace_id, 4)
    pool = harness.rt.pool
    counting = CountingPool(pool)
    gc = GroupCommitter(counting)  # type: ignore[arg-type]
    # The batch blocks on one run's row lock (its guard), and its backend is terminated meanwhile.
    killer = await kill_the_next_writer(database_url, started[0][0])

    results = await _complete_all(gc, started)

    assert await killer == 1
    assert counting.completions == ["batch", "batch"]  # the killed try, then the retry
    assert gc.batches == 1  # the killed try did not commit
    for (run_id, _), final in zip(started, results, strict=True):
        assert not isinstance(final, BaseException), final
        assert final["status"] == "COMPLETED"
        assert [e["sequence"] for e in await harness.events(run_id)] == [1, 2, 3, 4]
        assert len(await _deliveries(pool, run_id)) == 1


async def test_a_batch_that_committed_but_lost_its_connection_is_read_as_completed(
    harness: Harness, workspace_id: str
) -> None:
    """The connection died during COMMIT after the commit: the retry finds every run fenced out by
    that try's own write (lease released, step COMPLETED), and each caller reads its run as
    completed instead of failing with InvalidStateTransition; nothing is written twice."""
    await _subscribe(harness, workspace_id, ["workflow.completed"])
    started = await _started(harness, workspace_id, 3)
    pool = harness.rt.pool

    class Dropping(CommitThenDrop):
        async def fetchrow(self, sql: str, *args: Any) -> Any:
            return await self.pool.fetchrow(sql, *args)

    dropping = Dropping(pool)
    gc = GroupCommitter(dropping)  # type: ignore[arg-type]

    results = await _complete_all(gc, started)

    assert dropping.calls == 2  # the try that committed, then the retried batch (every row fenced)
    for n, ((run_id, _), final) in enumerate(zip(started, results, strict=True)):
        assert not isinstance(final, BaseException), final
        assert (final["id"], final["status"], final["output"]) == (run_id, "COMPLETED", {"done": n})
        assert [e["sequence"] for e in await harness.events(run_id)] == [1, 2, 3, 4]
        assert len(await _deliveries(pool, run_id)) == 1


async def test_a_run_another_worker_completed_after_a_lost_connection_is_not_read_as_ours(
    harness: Harness, workspace_id: str
) -> None:
    """The connection died before the completion ran (the worker cannot tell), and meanwhile
    another worker took the run over and completed the same step run. The retry is fenced out;
    the step and run are COMPLETED, but not by this worker's statement (its WORKFLOW_COMPLETED
    event is not there): its caller gets LeaseLost, not the other worker's ending as its own."""
    ((run_id, step_run_id),) = await _started(harness, workspace_id, 1)
    pool = harness.rt.pool
    completion_sql = (transitions.COMPLETION.batch_sql, transitions.COMPLETION.single_sql)

    class TakenOverThenDropped(CountingPool):
        async def _dropped_once(self, sql: str) -> None:
            if sql not in completion_sql:
                return
            self.completions.append("sent")
            if len(self.completions) == 1:
                await pool.execute(
                    "UPDATE workflow_runs SET lease_owner = 'other-worker' WHERE id = $1", run_id
                )
                await transitions.complete_last_step(
                    pool, run_id, step_run_id, "other-worker", {"by": "other"}, None
                )
                raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")

        async def fetch(self, sql: str, *args: Any) -> Any:
            await self._dropped_once(sql)
            return await self.pool.fetch(sql, *args)

        async def fetchrow(self, sql: str, *args: Any) -> Any:
            await self._dropped_once(sql)
            return await self.pool.fetchrow(sql, *args)

    dropping = TakenOverThenDropped(pool)
    with pytest.raises(LeaseLost):
        await transitions.complete_last_step(
            GroupCommitter(dropping), run_id, step_run_id, OWNER, {"n": 0}, None
        )  # type: ignore[arg-type]
    assert len(dropping.completions) == 2  # dropped, then retried and fenced out
    assert await pool.fetchval("SELECT output FROM step_runs WHERE id = $1", step_run_id) == {"by": "other"}
    assert [e["event_type"] for e in await harness.events(run_id)].count("WORKFLOW_COMPLETED") == 1


async def test_a_completion_batch_does_linear_work_in_its_rows(harness: Harness, workspace_id: str) -> None:
    """The batch carries each input through its sub-statements' RETURNING instead of joining back
    on the batch (nested loops comparing every row with every other, O(rows²)). Under EXPLAIN
    ANALYZE in a transaction rolled back: every run comes back once with its two events, and no
    join throws away as many rows as the batch holds."""
    started = await _started(harness, workspace_id, 12)
    doc = [
        dict(
            zip(
                transitions.COMPLETION.names,
                transitions.COMPLETION.row(
                    run_id,
                    OWNER,
                    transitions.LastStep(step_run_id, {"n": n}, None),
                    (f"evt_lin_s{n}", f"evt_lin_r{n}"),
                    f"whevt_lin{n}",
                    "2026-01-01T00:00:00Z",
                ),
                strict=True,
            )
        )
        for n, (run_id, step_run_id) in enumerate(started)
    ]
    async with harness.rt.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            explained = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + transitions.COMPLETION.batch_sql, doc
            )
            plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]
            events = await conn.fetchval("SELECT count(*) FROM workflow_events WHERE id LIKE 'evt_lin%'")
        finally:
            await tx.rollback()
    assert plan["Plan"]["Actual Rows"] == len(started) and events == 2 * len(started)
    assert _join_filter_rows(plan["Plan"]) < len(started)


async def test_completions_queued_with_both_checkpoint_kinds_go_out_before_the_next_pair(
    harness: Harness, workspace_id: str
) -> None:
    """The flusher writes a model call and a tool call of other runs together (the pair
    statement) and loops while rows keep arriving; a completion queued with them goes out right
    after that pair, before the pair of the rows that arrived meanwhile, so a steady stream of
    checkpoints cannot starve the runs' endings."""
    anchors, pool, _ = await leased(harness, workspace_id, 5)
    a, b, c, d, e = anchors
    await pool.execute("UPDATE step_runs SET status = 'RUNNING' WHERE id = $1", c["step_run_id"])
    sent: list[str] = []
    later: list[asyncio.Future[Any]] = []
    names = {PAIR_SQL: "pair", transitions.COMPLETION.single_sql: "completion"}

    class Recording:
        async def fetch(self, sql: str, *args: Any) -> Any:
            sent.append(names.get(sql, "other"))
            if sent == ["pair"]:  # while the first pair is in flight, both kinds arrive again
                later.append(asyncio.ensure_future(record_trace(gc, e, 901)))
                later.append(asyncio.ensure_future(_model_call(gc, d)))
            return await pool.fetch(sql, *args)

        async def fetchval(self, sql: str, *args: Any) -> Any:
            return await pool.fetchval(sql, *args)

    gc = GroupCommitter(Recording())  # type: ignore[arg-type]
    final, *_ = await asyncio.gather(
        transitions.complete_last_step(gc, c["workflow_run_id"], c["step_run_id"], GC_OWNER, {}, None),
        _model_call(gc, a),
        record_trace(gc, b, 900),
    )
    await asyncio.gather(*later)
    assert sent == ["pair", "completion", "pair"]
    assert final["status"] == "COMPLETED"


async def _model_call(gc: GroupCommitter, anchor: Any) -> None:
    rec = model_call(anchor, 90, 0)
    await checkpoints.record_llm_call(gc, anchor["workflow_run_id"], GC_OWNER, rec, "LLM_CALL_COMPLETED", {})
