"""Every guarded statement on runs and step runs, with one copy of each predicate.

Every state change is `UPDATE ... WHERE id = $1 AND status = ANY(expected) [AND lease_owner = me]
RETURNING ...`: zero rows means somebody else moved the row first, and the caller gets
`LeaseLost` / `InvalidStateTransition` instead of overwriting it. Callers own the transaction.

Events take their per-run `sequence` from `workflow_runs.event_seq`, incremented by the same
statement that changes the run. That row lock serialises every event writer of one run until
commit, so sequences are gap-free and in commit order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from stevora.db.checkpoint_sql import pending_messages
from stevora.errors import InvalidStateTransition, LeaseLost
from stevora.events import Event
from stevora.ids import new_id
from stevora.statuses import ACTIVE_RUN_STATUSES, OPEN_STEP_STATUSES, StepStatus

RUN_COLUMNS = (
    "id, workspace_id, definition_id, status, current_step_name, current_step_run_id, input, state, "
    "output, error, next_run_at, lease_owner, lease_expires_at, version, started_at, created_at, "
    "parent_run_id, parent_tool_call_id, depth, budget, crash_count, concurrency_key, concurrency_limit, "
    "concurrency_hold_waiting, workspace_limit, priority, queued_at, thread_id"
)
STEP_COLUMNS = (
    "id, workflow_run_id, step_name, step_type, step_index, visit, attempt, status, input, output, "
    "error, signal_type, wait_until, started_at, completed_at, created_at"
)
# Whether messages sent to the run wait for an llm step, with the rows an execution starts from.
_PENDING_MESSAGES = pending_messages("workflow_runs")

# A run a worker may hold: not finished, not paused.
LEASABLE = "status IN ('PENDING', 'RUNNING', 'WAITING')"
# ... that nobody holds now and that has something to do now. A WAITING run without a wake-up
# time (a signal, an approval, tool outputs) is woken by whoever delivers what it waits for.
RUNNABLE = (
    f"{LEASABLE} AND (lease_owner IS NULL OR lease_expires_at < now()) "
    "AND (next_run_at IS NULL OR next_run_at <= now()) "
    "AND (status <> 'WAITING' OR next_run_at IS NOT NULL)"
)

# Columns a transition may set on workflow_runs / step_runs (whitelist for the dynamic SQL).
_RUN_SETTABLE = frozenset(
    {
        "status",
        "current_step_name",
        "current_step_run_id",
        "output",
        "error",
        "next_run_at",
        "started_at",
        "completed_at",
        "failed_at",
        "cancelled_at",
        "lease_owner",
        "lease_expires_at",
        "dispatched_at",
        "budget",
        "crash_count",
    }
)
_STEP_SETTABLE = frozenset(
    {
        "status",
        "output",
        "error",
        "signal_type",
        "wait_until",
        "started_at",
        "completed_at",
        "input",
        "state_updates",
    }
)
RELEASE: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}


@dataclass(frozen=True)
class FlowColumns:
    """A new run's flow control (stevora.engine.flow.resolve): none by default."""

    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    hold_waiting: bool = True
    workspace_limit: int | None = None
    priority: int = 0


async def update_run(
    conn: asyncpg.Connection,
    run_id: str,
    *,
    expect: Sequence[str],
    owner: str | None = None,
    sets: dict[str, Any] | None = None,
    merge_state: dict[str, Any] | None = None,
    output_from_state: bool = False,
    events: Sequence[Event] = (),
    now_columns: Iterable[str] = (),
) -> asyncpg.Record:
    """Guarded run update + its events, in the caller's transaction.

    `owner` fences the write to the lease holder. `now_columns` are set to the transaction's
    `now()`. `output_from_state` copies the (pre-update) state into `output`. Raises LeaseLost
    (owner given) or InvalidStateTransition when the guard fails.
    """
    sets = sets or {}
    params: list[Any] = [run_id, list(expect), len(events)]
    assignments = ["version = version + 1", "updated_at = now()", "event_seq = event_seq + $3"]
    for column, value in sets.items():
        if column not in _RUN_SETTABLE:
            raise ValueError(f"not a settable run column: {column}")
        params.append(value)
        assignments.append(f"{column} = ${len(params)}")
    for column in now_columns:
        if column not in _RUN_SETTABLE:
            raise ValueError(f"not a settable run column: {column}")
        assignments.append(f"{column} = now()")
    if merge_state:
        params.append(merge_state)
        # Shallow merge: top-level keys of the update replace those of the old state.
        assignments.append(f"state = COALESCE(state, '{{}}'::jsonb) || ${len(params)}::jsonb")
    if output_from_state:
        assignments.append("output = state")
    guard = "id = $1 AND status = ANY($2::text[])"
    if owner is not None:
        params.append(owner)
        guard += f" AND lease_owner = ${len(params)}"
        if "crash_count" not in sets:
            # A transition of the lease holder is progress: the run's crashes no longer add up
            # (stevora/engine/poison.py). Free here: the statement writes the row anyway.
            assignments.append("crash_count = 0")
    row = await conn.fetchrow(
        f"UPDATE workflow_runs SET {', '.join(assignments)} WHERE {guard} "
        f"RETURNING {RUN_COLUMNS}, event_seq, total_cost_cents, {_PENDING_MESSAGES}",
        *params,
    )
    if row is None:
        if owner is not None:
            raise LeaseLost(f"run {run_id} is no longer leased by this worker in status {list(expect)}")
        raise InvalidStateTransition(
            f"Workflow run {run_id} is not in an allowed status ({', '.join(expect)})",
            details={"workflowRunId": run_id, "expectedStatus": list(expect)},
        )
    if events:
        await insert_events(conn, run_id, row["event_seq"] - len(events) + 1, events)
    return row


async def insert_events(
    conn: asyncpg.Connection, run_id: str, first_seq: int, events: Sequence[Event]
) -> None:
    await conn.execute(
        "INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload) "
        "SELECT e.id, $1, e.step_run_id, e.seq, e.event_type, e.payload "
        "FROM unnest($2::text[], $3::text[], $4::int[], $5::text[], $6::jsonb[]) "
        "AS e(id, step_run_id, seq, event_type, payload)",
        run_id,
        [new_id("evt") for _ in events],
        [e.step_run_id for e in events],
        list(range(first_seq, first_seq + len(events))),
        [e.event_type for e in events],
        [e.payload for e in events],
    )


async def update_step(
    conn: asyncpg.Connection,
    step_run_id: str,
    *,
    expect: Sequence[str],
    sets: dict[str, Any] | None = None,
    now_columns: Iterable[str] = (),
) -> asyncpg.Record:
    sets = sets or {}
    params: list[Any] = [step_run_id, list(expect)]
    assignments = ["updated_at = now()"]
    for column, value in sets.items():
        if column not in _STEP_SETTABLE:
            raise ValueError(f"not a settable step column: {column}")
        params.append(value)
        assignments.append(f"{column} = ${len(params)}")
    for column in now_columns:
        assignments.append(f"{column} = now()")
    row = await conn.fetchrow(
        f"UPDATE step_runs SET {', '.join(assignments)} WHERE id = $1 AND status = ANY($2::text[]) "
        f"RETURNING {STEP_COLUMNS}",
        *params,
    )
    if row is None:
        raise InvalidStateTransition(
            f"Step run {step_run_id} is not in an allowed status ({', '.join(expect)})",
            details={"stepRunId": step_run_id, "expectedStatus": list(expect)},
        )
    return row


async def insert_step_run(
    conn: asyncpg.Connection,
    *,
    run_id: str,
    step_name: str,
    step_type: str,
    step_index: int,
    visit: int,
    attempt: int,
    status: StepStatus = StepStatus.PENDING,
) -> asyncpg.Record:
    # A step run inserted RUNNING is started now (the driver starts the next step as it inserts it).
    row = await conn.fetchrow(
        "INSERT INTO step_runs (id, workflow_run_id, step_name, step_type, step_index, visit, attempt, status, "
        "started_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text, CASE WHEN $8::text = 'RUNNING' THEN now() END) "
        f"RETURNING {STEP_COLUMNS}",
        new_id("srun"),
        run_id,
        step_name,
        step_type,
        step_index,
        visit,
        attempt,
        status,
    )
    assert row is not None
    return row


async def next_visit(conn: asyncpg.Connection, run_id: str, step_name: str) -> int:
    last = await conn.fetchval(
        "SELECT max(visit) FROM step_runs WHERE workflow_run_id = $1 AND step_name = $2", run_id, step_name
    )
    return int(last or 0) + 1


async def get_run(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {RUN_COLUMNS}, {_PENDING_MESSAGES} FROM workflow_runs WHERE id = $1", run_id
    )


# Row locks on runs are FOR NO KEY UPDATE, the lock an UPDATE that keeps the key takes: it
# serialises writers of one run but lets foreign-key checks (FOR KEY SHARE) through. With FOR
# UPDATE, two children of one parent ending at once deadlocked: each had key-share-locked the
# parent (updating its own row twice in one transaction re-checks its `parent_run_id`), then each
# waited for the other to upgrade to FOR UPDATE.
ROW_LOCK = "FOR NO KEY UPDATE"


async def lock_run(conn: asyncpg.Connection, run_id: str) -> asyncpg.Record | None:
    """The run, row-locked until the caller's transaction ends (serialises writers of one run)."""
    return await conn.fetchrow(f"SELECT {RUN_COLUMNS} FROM workflow_runs WHERE id = $1 {ROW_LOCK}", run_id)


async def get_run_in_workspace(
    conn: asyncpg.Connection, workspace_id: str, run_id: str, *, for_update: bool = False
) -> asyncpg.Record | None:
    """The run if it belongs to the workspace (another workspace's run is simply not found)."""
    lock = f" {ROW_LOCK}" if for_update else ""
    return await conn.fetchrow(
        f"SELECT {RUN_COLUMNS} FROM workflow_runs WHERE id = $1 AND workspace_id = $2{lock}",
        run_id,
        workspace_id,
    )


async def get_step_run(conn: asyncpg.Connection | asyncpg.Pool, step_run_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {STEP_COLUMNS} FROM step_runs WHERE id = $1", step_run_id)


async def insert_run(
    conn: asyncpg.Connection | asyncpg.Pool,
    *,
    workspace_id: str,
    definition_id: str,
    input: dict[str, Any],
    idempotency_key: str | None,
    parent_run_id: str | None = None,
    parent_tool_call_id: str | None = None,
    depth: int = 1,
    trace_context: dict[str, str] | None = None,
    budget: dict[str, Any] | None = None,
    flow: FlowColumns | None = None,
) -> asyncpg.Record | None:
    """Insert a PENDING run, checking the definition belongs to the workspace in the same statement.

    None when the definition is not found or the idempotency key is taken (the caller tells which).
    """
    flow = flow or FlowColumns()
    return await conn.fetchrow(
        "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, idempotency_key, "
        "dispatched_at, parent_run_id, parent_tool_call_id, depth, trace_context, budget, "
        "concurrency_key, concurrency_limit, concurrency_hold_waiting, workspace_limit, priority) "
        "SELECT $1, $2::text, d.id, 'PENDING', $4, $5, now(), $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 "
        "FROM workflow_definitions d "
        "WHERE d.id = $3 AND d.workspace_id = $2 "
        "ON CONFLICT (workspace_id, idempotency_key) DO NOTHING "
        f"RETURNING {RUN_COLUMNS}",
        new_id("wfrun"),
        workspace_id,
        definition_id,
        input,
        idempotency_key,
        parent_run_id,
        parent_tool_call_id,
        depth,
        trace_context,
        budget,
        flow.concurrency_key,
        flow.concurrency_limit,
        flow.hold_waiting,
        flow.workspace_limit,
        flow.priority,
    )


@dataclass(frozen=True, slots=True)
class KeyedRun:
    """A top-level run to insert under an idempotency key (`insert_keyed_runs`)."""

    workspace_id: str
    definition_id: str
    input: dict[str, Any]
    idempotency_key: str
    trace_context: dict[str, str] | None
    budget: dict[str, Any] | None
    flow: FlowColumns


async def insert_keyed_runs(conn: asyncpg.Connection, news: Sequence[KeyedRun]) -> dict[tuple[str, str], str]:
    """Insert PENDING runs in one statement, each checking its definition belongs to its
    workspace; {(workspace, key): run id} of the runs inserted (a key already taken, or a
    definition not found, is left out)."""
    if not news:
        return {}
    rows = await conn.fetch(
        "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, idempotency_key, "
        "dispatched_at, depth, trace_context, budget, concurrency_key, concurrency_limit, "
        "concurrency_hold_waiting, workspace_limit, priority) "
        "SELECT n.id, n.ws, d.id, 'PENDING', n.input, n.key, now(), 1, n.trace, n.budget, n.ckey, n.climit, "
        "n.hold, n.wlimit, n.priority "
        "FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::jsonb[], $7::jsonb[], "
        "$8::text[], $9::int[], $10::bool[], $11::int[], $12::int[]) WITH ORDINALITY "
        "AS n(id, ws, def, input, key, trace, budget, ckey, climit, hold, wlimit, priority, ord) "
        "JOIN workflow_definitions d ON d.id = n.def AND d.workspace_id = n.ws "
        "ORDER BY n.ord "
        "ON CONFLICT (workspace_id, idempotency_key) DO NOTHING RETURNING id, workspace_id, idempotency_key",
        [new_id("wfrun") for _ in news],
        [n.workspace_id for n in news],
        [n.definition_id for n in news],
        [n.input for n in news],
        [n.idempotency_key for n in news],
        [n.trace_context for n in news],
        [n.budget for n in news],
        [n.flow.concurrency_key for n in news],
        [n.flow.concurrency_limit for n in news],
        [n.flow.hold_waiting for n in news],
        [n.flow.workspace_limit for n in news],
        [n.flow.priority for n in news],
    )
    return {(r["workspace_id"], r["idempotency_key"]): r["id"] for r in rows}


async def run_ids_by_key(
    conn: asyncpg.Connection, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], str]:
    """{(workspace, key): run id} of the runs already holding these (workspace, key) pairs."""
    rows = await conn.fetch(
        "SELECT r.id, r.workspace_id, r.idempotency_key FROM unnest($1::text[], $2::text[]) AS k(ws, key) "
        "JOIN workflow_runs r ON r.workspace_id = k.ws AND r.idempotency_key = k.key",
        [ws for ws, _ in keys],
        [key for _, key in keys],
    )
    return {(r["workspace_id"], r["idempotency_key"]): r["id"] for r in rows}


async def get_run_by_idempotency_key(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, key: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {RUN_COLUMNS} FROM workflow_runs WHERE workspace_id = $1 AND idempotency_key = $2",
        workspace_id,
        key,
    )


async def active_children(conn: asyncpg.Connection, run_id: str) -> list[str]:
    """Children of `run_id` that are still active, locked (a child ending concurrently either
    finished first — and is skipped — or waits for this transaction)."""
    rows = await conn.fetch(
        "SELECT id FROM workflow_runs WHERE parent_run_id = $1 AND status = ANY($2::text[]) "
        f"ORDER BY id {ROW_LOCK}",
        run_id,
        list(ACTIVE_RUN_STATUSES),
    )
    return [r["id"] for r in rows]


async def ancestor_definition_names(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> list[str]:
    """The definition names of a run and of every run above it (parent, grandparent, ...)."""
    rows = await conn.fetch(
        "WITH RECURSIVE chain(id, parent_run_id, definition_id) AS ("
        "  SELECT id, parent_run_id, definition_id FROM workflow_runs WHERE id = $1"
        "  UNION ALL"
        "  SELECT r.id, r.parent_run_id, r.definition_id FROM workflow_runs r JOIN chain c ON r.id = c.parent_run_id"
        ") SELECT d.name FROM chain c JOIN workflow_definitions d ON d.id = c.definition_id",
        run_id,
    )
    return [r["name"] for r in rows]


async def completed_step_outputs(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> dict[str, Any]:
    """`{step name: {"output": ...}}` for every step of the run that completed (its latest visit):
    what `{{steps.<name>.output.x}}` reads."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (step_name) step_name, output FROM step_runs "
        "WHERE workflow_run_id = $1 AND status = 'COMPLETED' ORDER BY step_name, created_at DESC",
        run_id,
    )
    return {r["step_name"]: {"output": r["output"] or {}} for r in rows}


async def cancel_open_steps(conn: asyncpg.Connection, run_id: str) -> list[str]:
    rows = await conn.fetch(
        "UPDATE step_runs SET status = 'CANCELLED', updated_at = now(), completed_at = now() "
        "WHERE workflow_run_id = $1 AND status = ANY($2::text[]) RETURNING id",
        run_id,
        list(OPEN_STEP_STATUSES),
    )
    return [r["id"] for r in rows]


# -- leases ------------------------------------------------------------------------------------

# A thread's turn waiting for the turns before it is not dispatched by the sweep: the ending of
# the turn before it dispatches it (`stevora.db.threads.turn_ended`). As
# `stevora.db.concurrency.turn_ready`, which imports this module.
_TURN_READY = (
    "(thread_id IS NULL OR status <> 'PENDING' OR NOT EXISTS (SELECT 1 FROM workflow_runs t "
    "WHERE t.thread_id = workflow_runs.thread_id AND t.status IN ('PENDING', 'RUNNING', 'WAITING', 'PAUSED') "
    "AND (t.created_at, t.id) < (workflow_runs.created_at, workflow_runs.id)))"
)

_SWEEP_SQL = f"""
UPDATE workflow_runs SET dispatched_at = now()
WHERE id IN (
    SELECT id FROM workflow_runs
    WHERE {RUNNABLE} AND queued_at IS NULL AND {_TURN_READY}
      AND (dispatched_at IS NULL OR dispatched_at < now() - make_interval(secs => $1))
    ORDER BY next_run_at NULLS FIRST
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
RETURNING id
"""


async def get_claimed(pool: asyncpg.Pool, run_id: str) -> asyncpg.Record | None:
    """The run with the columns `transitions.claim` returns (for a claim whose commit outcome was unknown)."""
    return await pool.fetchrow(
        f"SELECT {RUN_COLUMNS}, dispatched_at, trace_context FROM workflow_runs WHERE id = $1", run_id
    )


async def renew_leases(pool: asyncpg.Pool, run_ids: list[str], owner: str, lease_s: float) -> set[str]:
    """Extend the leases this owner still holds; returns the ids still held."""
    rows = await pool.fetch(
        "UPDATE workflow_runs SET lease_expires_at = now() + make_interval(secs => $3) "
        f"WHERE id = ANY($1::text[]) AND lease_owner = $2 AND {LEASABLE} RETURNING id",
        run_ids,
        owner,
        lease_s,
    )
    return {r["id"] for r in rows}


async def release(pool: asyncpg.Pool, run_id: str, owner: str) -> None:
    await pool.execute(
        "UPDATE workflow_runs SET lease_owner = NULL, lease_expires_at = NULL WHERE id = $1 AND lease_owner = $2",
        run_id,
        owner,
    )


async def release_all(pool: asyncpg.Pool, owner: str) -> list[str]:
    """Hand back every lease of this owner (clean shutdown); returns the runs to re-dispatch."""
    rows = await pool.fetch(
        "UPDATE workflow_runs SET lease_owner = NULL, lease_expires_at = NULL, dispatched_at = NULL "
        "WHERE lease_owner = $1 RETURNING id",
        owner,
    )
    return [r["id"] for r in rows]


async def mark_due_dispatched(pool: asyncpg.Pool, grace_s: float, limit: int) -> list[str]:
    """Runs that are runnable and were not dispatched within the grace period, marked dispatched."""
    rows = await pool.fetch(_SWEEP_SQL, grace_s, limit)
    return [r["id"] for r in rows]


async def count_crash(conn: asyncpg.Connection | asyncpg.Pool, run_id: str, owner: str) -> int | None:
    """Add one to the crash count of a run `owner` holds; the new count (None: the lease is gone)."""
    count: int | None = await conn.fetchval(
        "UPDATE workflow_runs SET crash_count = crash_count + 1 "
        "WHERE id = $1 AND lease_owner = $2 RETURNING crash_count",
        run_id,
        owner,
    )
    return count
