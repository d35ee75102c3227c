"""Lost database connections (a restart, a failover, `pg_terminate_backend`) while runs are in
flight: retried with backoff, never a step's failed attempt, never a run left waiting out its lease.

The tests terminate every backend of the test's own database (never the server's other databases),
from inside a handler, so the engine's pooled connections die at a known moment.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from stevora.db import checkpoints, transitions
from stevora.db.checkpoints import ToolTraceRecord
from stevora.db.database import asyncpg_dsn
from stevora.db.group_commit import GroupCommitter
from stevora.db.transient import Retrier, is_transient, retry_transient
from stevora.engine import commands, endings
from stevora.events import EventType
from stevora.ids import new_id
from tests.conftest import Harness, create_definition

TERMINATE_SQL = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


async def terminate_backends(database_url: str) -> int:
    """Terminate every other connection to the test database; returns how many."""
    admin = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return int(await admin.fetchval(TERMINATE_SQL))
    finally:
        await admin.close()


async def kill_the_next_writer(database_url: str, run_id: str) -> asyncio.Task[int]:
    """Lock the run's row, terminate the first backend that blocks on it (a checkpoint or a
    transition in flight), then let go. Returns the task; its result is how many were killed."""
    locker = await asyncpg.connect(asyncpg_dsn(database_url))
    tx = locker.transaction()
    await tx.start()
    await locker.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR UPDATE", run_id)
    locker_pid = locker.get_server_pid()

    async def kill() -> int:
        killer = await asyncpg.connect(asyncpg_dsn(database_url))
        killed = 0
        try:
            for _ in range(500):
                killed = int(
                    await killer.fetchval(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE $1 = ANY(pg_blocking_pids(pid))",
                        locker_pid,
                    )
                )
                if killed:
                    break
                await asyncio.sleep(0.01)
        finally:
            await tx.rollback()
            await locker.close()
            await killer.close()
        return killed

    return asyncio.create_task(kill())


async def wait_for_status(harness: Harness, run_id: str, *statuses: str, timeout_s: float) -> asyncpg.Record:
    """Harness.wait_for_status through lost connections of its own."""
    return await retry_transient(
        lambda: harness.wait_for_status(run_id, *statuses, timeout_s=timeout_s), "test_wait"
    )


def one_task_workflow(handler: str, **step: Any) -> dict[str, Any]:
    return {
        "name": f"wf-{handler}",
        "version": "1",
        "steps": [{"type": "task", "name": "t", "handler": handler, **step}],
    }


async def test_connections_terminated_during_a_task_neither_fail_the_step_nor_rerun_the_handler(
    harness: Harness, workspace_id: str, database_url: str
) -> None:
    calls: list[int] = []
    killed: list[int] = []

    async def handler(ctx: Any) -> dict[str, Any]:
        calls.append(ctx.attempt)
        # Every pooled connection dies while the handler runs; the outcome is written after.
        killed.append(await terminate_backends(database_url))
        return {"ok": True}

    harness.tasks.register("killer", handler)
    def_id = await create_definition(harness.rt, workspace_id, one_task_workflow("killer"))
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    started = asyncio.get_running_loop().time()
    row = await wait_for_status(harness, run["id"], "COMPLETED", "FAILED", timeout_s=15)
    elapsed = asyncio.get_running_loop().time() - started

    assert killed and killed[0] >= 1
    assert row["status"] == "COMPLETED", row["error"]
    assert calls == [1]  # the outcome was retried, not the handler
    types = await harness.event_types(run["id"])
    assert "STEP_FAILED" not in types and "STEP_RETRYING" not in types
    # Not stranded: well under the lease (5 s in tests) a stranded run would have waited out.
    assert elapsed < harness.rt.settings.lease_s - 1, elapsed


async def test_a_checkpoint_killed_in_flight_is_retried_in_place_not_as_a_failed_attempt(
    harness: Harness, workspace_id: str, database_url: str
) -> None:
    executions: dict[str, int] = {}
    killers: list[asyncio.Task[int]] = []

    async def search(input: dict[str, Any], ctx: Any) -> list[dict[str, str]]:
        executions["search"] = executions.get("search", 0) + 1
        if not killers:  # the checkpoint that records this call is killed while it runs
            killers.append(await kill_the_next_writer(database_url, ctx.workflow_run_id))
        return [{"title": "Refund policy"}]

    async def customer(input: dict[str, Any]) -> dict[str, Any]:
        executions["customer"] = executions.get("customer", 0) + 1
        return {"plan": "team"}

    harness.tools.register("search_knowledge_base", search)
    harness.tools.register("get_customer_data", customer)
    spec = {
        "name": "agent",
        "version": "1",
        "steps": [
            {
                "type": "llm",
                "name": "agent",
                "model": "scripted",
                "messages": [{"role": "user", "content": "{{input.question}}"}],
                "tools": [{"name": "search_knowledge_base"}, {"name": "get_customer_data"}],
                "parallelToolCalls": True,
            }
        ],
    }
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "Refunds?"})
    row = await wait_for_status(harness, run["id"], "COMPLETED", "FAILED", timeout_s=15)

    assert await killers[0] >= 1
    assert row["status"] == "COMPLETED", row["error"]
    assert executions == {"search": 1, "customer": 1}
    types = await harness.event_types(run["id"])
    assert "STEP_FAILED" not in types and "STEP_RETRYING" not in types
    assert types.count("TOOL_CALL_COMPLETED") == 2
    traces = await harness.rt.pool.fetch("SELECT * FROM tool_trace WHERE workflow_run_id = $1", run["id"])
    assert len(traces) == 2
    sequences = [e["sequence"] for e in await harness.events(run["id"])]
    assert sequences == list(range(1, len(sequences) + 1))


async def test_many_runs_survive_repeated_backend_terminations(
    harness: Harness, workspace_id: str, database_url: str
) -> None:
    """Also the regression test for "cannot switch to state N; another operation (2) is in
    progress": it came from idle pooled connections whose backend was terminated."""
    done: list[str] = []

    async def slow(ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        done.append(ctx.workflow_run_id)
        return {"n": 1}

    harness.tasks.register("slow", slow)
    spec = {
        "name": "many",
        "version": "1",
        "steps": [
            {"type": "task", "name": "a", "handler": "slow"},
            {"type": "task", "name": "b", "handler": "slow"},
            {"type": "task", "name": "c", "handler": "slow"},
        ],
    }
    def_id = await create_definition(harness.rt, workspace_id, spec)
    ids = [(await commands.create_run(harness.rt, workspace_id, def_id))[0]["id"] for _ in range(30)]
    kills = 0
    for _ in range(6):
        await asyncio.sleep(0.04)
        kills += await terminate_backends(database_url)
    rows = [await wait_for_status(harness, i, "COMPLETED", "FAILED", timeout_s=20) for i in ids]

    assert kills > 0
    assert [r["status"] for r in rows] == ["COMPLETED"] * 30, [r["error"] for r in rows if r["error"]]
    failed = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_events WHERE workflow_run_id = ANY($1::text[]) "
        "AND event_type IN ('STEP_FAILED', 'STEP_RETRYING')",
        ids,
    )
    assert failed == 0


def test_a_terminated_idle_connection_counts_as_a_lost_connection() -> None:
    # What asyncpg raises when a task acquires a pooled connection whose backend sent FATAL
    # but whose socket's EOF has not been read yet.
    assert is_transient(
        asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress")
    )
    assert is_transient(
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
    )
    assert is_transient(asyncpg.AdminShutdownError("terminating connection due to administrator command"))
    assert is_transient(asyncpg.CannotConnectNowError("the database system is starting up"))
    assert is_transient(ConnectionRefusedError(111, "Connect call failed"))
    assert not is_transient(asyncpg.UniqueViolationError("duplicate key"))
    assert not is_transient(asyncpg.InternalClientError("unexpected error"))
    assert not is_transient(ValueError("bad"))


class CommitThenDrop:
    """A pool whose first `fetch` commits and then reports a lost connection: the outcome a
    client sees when the connection dies during COMMIT."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.calls = 0

    async def fetch(self, sql: str, *args: Any) -> Any:
        self.calls += 1
        value = await self.pool.fetch(sql, *args)
        if self.calls == 1:
            raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
        return value

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self.pool.fetchval(sql, *args)


async def _running_run_with_llm_call(harness: Harness, workspace_id: str) -> tuple[str, str, str]:
    def_id = await create_definition(harness.rt, workspace_id, one_task_workflow("noop"))
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)  # no handler: fails fast
    await harness.wait_for_status(run["id"], "FAILED")
    owner = "test-owner"
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET status = 'RUNNING', lease_owner = $2, lease_expires_at = now() + interval '1 minute' "
        "WHERE id = $1",
        run["id"],
        owner,
    )
    step_run_id = await harness.rt.pool.fetchval(
        "SELECT id FROM step_runs WHERE workflow_run_id = $1", run["id"]
    )
    llm_id = new_id("llm")
    await harness.rt.pool.execute(
        "INSERT INTO llm_calls (id, workflow_run_id, step_run_id, step_name, round, model, status, request) "
        "VALUES ($1, $2, $3, 't', 1, 'm', 'completed', '{}')",
        llm_id,
        run["id"],
        step_run_id,
    )
    return run["id"], step_run_id, llm_id


def _trace(step_run_id: str, llm_id: str) -> ToolTraceRecord:
    return ToolTraceRecord(
        step_run_id=step_run_id,
        llm_call_id=llm_id,
        round=1,
        sequence=0,
        tool_call_id="call_0",
        tool_name="t",
        input_json={},
        output_json={"ok": True},
        status="completed",
        error=None,
        error_code=None,
        result_text=None,
        duration_ms=1.0,
        idempotency_key=f"{step_run_id}:1:0",
    )


async def test_a_checkpoint_whose_commit_outcome_was_unknown_is_not_written_twice(
    harness: Harness, workspace_id: str
) -> None:
    run_id, step_run_id, llm_id = await _running_run_with_llm_call(harness, workspace_id)
    seq_before = await harness.rt.pool.fetchval("SELECT event_seq FROM workflow_runs WHERE id = $1", run_id)
    pool = CommitThenDrop(harness.rt.pool)

    await checkpoints.record_tool_trace(
        GroupCommitter(pool),  # type: ignore[arg-type]
        run_id,
        "test-owner",
        _trace(step_run_id, llm_id),
        EventType.TOOL_CALL_COMPLETED,
        {"ok": True},
    )

    assert pool.calls == 2  # retried, and the retry found the record
    traces = await harness.rt.pool.fetch("SELECT * FROM tool_trace WHERE llm_call_id = $1", llm_id)
    assert len(traces) == 1
    events = await harness.rt.pool.fetch(
        "SELECT sequence FROM workflow_events WHERE workflow_run_id = $1 AND event_type = 'TOOL_CALL_COMPLETED'",
        run_id,
    )
    assert [e["sequence"] for e in events] == [seq_before + 1]
    assert (
        await harness.rt.pool.fetchval("SELECT event_seq FROM workflow_runs WHERE id = $1", run_id)
        == seq_before + 1
    )


async def test_a_duplicate_checkpoint_on_a_first_try_is_still_an_error(
    harness: Harness, workspace_id: str
) -> None:
    run_id, step_run_id, llm_id = await _running_run_with_llm_call(harness, workspace_id)
    rec = _trace(step_run_id, llm_id)
    await checkpoints.record_tool_trace(
        harness.rt.committer, run_id, "test-owner", rec, EventType.TOOL_CALL_COMPLETED, {}
    )
    again = _trace(step_run_id, llm_id)
    with pytest.raises(asyncpg.UniqueViolationError):
        await checkpoints.record_tool_trace(
            harness.rt.committer, run_id, "test-owner", again, EventType.TOOL_CALL_COMPLETED, {}
        )


async def test_a_claim_whose_commit_outcome_was_unknown_still_starts_the_run(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_claim = transitions.claim
    tries: list[int] = []

    async def claim_then_drop(pool: asyncpg.Pool, run_id: str, owner: str, lease_s: float) -> Any:
        tries.append(1)
        row = await real_claim(pool, run_id, owner, lease_s)
        if len(tries) == 1:
            raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
        return row

    monkeypatch.setattr(transitions, "claim", claim_then_drop)
    harness.tasks.register("fine", lambda ctx: {"ok": True})
    def_id = await create_definition(harness.rt, workspace_id, one_task_workflow("fine"))
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=3)
    assert row["status"] == "COMPLETED"
    assert len(tries) == 2


@pytest.mark.parametrize("error", [asyncpg.DeadlockDetectedError, asyncpg.SerializationError])
async def test_a_deadlock_while_recording_an_outcome_is_retried_not_the_handler(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    """PostgreSQL rolled the outcome's transaction back and asks for it to be run again: the
    driver does so in place. Failing the pass instead handed the run back and ran the handler again
    (the chaos suite saw a child run's task executed three times)."""
    real = endings.complete_with_last_step
    raised: list[str] = []

    async def deadlocking(*args: Any, **kwargs: Any) -> Any:
        if not raised:
            raised.append(error.__name__)
            raise error("deadlock detected")
        return await real(*args, **kwargs)

    monkeypatch.setattr(endings, "complete_with_last_step", deadlocking)
    calls: list[int] = []

    async def handler(ctx: Any) -> dict[str, Any]:
        calls.append(ctx.attempt)
        return {"ok": True}

    harness.tasks.register("once", handler)
    def_id = await create_definition(harness.rt, workspace_id, one_task_workflow("once"))
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=10)

    assert raised == [error.__name__]
    assert row["status"] == "COMPLETED", row["error"]
    assert calls == [1]
    assert is_transient(error("x"))


async def test_a_retry_after_a_deadlock_knows_nothing_was_written() -> None:
    """A deadlock was rolled back for certain: a retry that then finds the rows must not read them
    as its own earlier write (only a lost connection leaves the outcome unknown)."""
    rolled_back = Retrier("t")
    await rolled_back.pause(asyncpg.DeadlockDetectedError("deadlock detected"))
    await rolled_back.pause(asyncpg.SerializationError("could not serialize"))
    assert rolled_back.failures == 2 and not rolled_back.outcome_unknown

    lost = Retrier("t")
    await lost.pause(asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"))
    assert lost.outcome_unknown
    lost.reset()
    assert not lost.outcome_unknown
