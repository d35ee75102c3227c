"""Guarded SQL for runs, step runs and events (raw asyncpg; callers own the transaction).

Every state change is `UPDATE ... WHERE id = $1 AND status = ANY(expected) [AND lease_owner = me]
RETURNING ...`: zero rows means somebody else moved the row first, and the caller gets
`LeaseLost` / `InvalidStateTransition` instead of overwriting it.

Events take their per-run `sequence` from `workflow_runs.event_seq`, incremented by the same
statement that changes the run. That row lock serialises every event writer of one run until
commit, so sequences are gap-free and in commit order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from stevora.clock import iso, utcnow
from stevora.errors import InvalidStateTransition, LeaseLost
from stevora.ids import new_id

# Transition tables, exactly as documented (reference §6). The guarded SQL below only ever
# moves rows along these edges; tests assert each helper against them.
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    "PENDING": frozenset({"RUNNING", "CANCELLED"}),
    "RUNNING": frozenset({"WAITING", "PAUSED", "COMPLETED", "FAILED", "CANCELLED"}),
    "WAITING": frozenset({"RUNNING", "CANCELLED", "FAILED"}),
    "PAUSED": frozenset({"RUNNING", "CANCELLED"}),
    "COMPLETED": frozenset(),
    "FAILED": frozenset({"RUNNING"}),
    "CANCELLED": frozenset(),
}
STEP_TRANSITIONS: dict[str, frozenset[str]] = {
    "PENDING": frozenset({"RUNNING", "SKIPPED", "CANCELLED"}),
    "RUNNING": frozenset({"WAITING", "COMPLETED", "FAILED", "CANCELLED"}),
    "WAITING": frozenset({"RUNNING", "COMPLETED", "FAILED", "CANCELLED"}),
    "COMPLETED": frozenset(),
    "FAILED": frozenset({"RUNNING"}),
    "SKIPPED": frozenset(),
    "CANCELLED": frozenset(),
}


def sources_for(target: str, table: dict[str, frozenset[str]]) -> list[str]:
    """Every status that may legally move to `target`."""
    return [src for src, dests in table.items() if target in dests]


@dataclass(frozen=True, slots=True)
class Event:
    event_type: str
    payload: dict[str, Any]
    step_run_id: str | None = None


def step_completed_event(step: asyncpg.Record) -> Event:
    """`STEP_COMPLETED` for a step row just moved to COMPLETED (its started/completed times set)."""
    started, completed = step["started_at"], step["completed_at"]
    duration_ms = max(0, int((completed - started).total_seconds() * 1000)) if started and completed else 0
    return Event("STEP_COMPLETED", {"stepName": step["step_name"], "durationMs": duration_ms}, step["id"])


RUN_COLUMNS = (
    "id, workspace_id, definition_id, status, current_step_name, current_step_run_id, input, state, "
    "output, error, next_run_at, lease_owner, lease_expires_at, version, started_at, created_at"
)
STEP_COLUMNS = (
    "id, workflow_run_id, step_name, step_type, step_index, visit, attempt, status, input, output, "
    "error, signal_type, wait_until, started_at, completed_at, created_at"
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
    }
)
_STEP_SETTABLE = frozenset(
    {"status", "output", "error", "signal_type", "wait_until", "started_at", "completed_at", "input"}
)


async def update_run(
    conn: asyncpg.Connection,
    run_id: str,
    *,
    expect: Sequence[str],
    owner: str | None = None,
    sets: dict[str, Any] | None = None,
    merge_state: dict[str, Any] | None = None,
    events: Sequence[Event] = (),
    now_columns: Iterable[str] = (),
) -> asyncpg.Record:
    """Guarded run update + its events, in the caller's transaction.

    `owner` fences the write to the lease holder. `now_columns` are set to the transaction's
    `now()`. Raises LeaseLost (owner given) or InvalidStateTransition when the guard fails.
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
    guard = "id = $1 AND status = ANY($2::text[])"
    if owner is not None:
        params.append(owner)
        guard += f" AND lease_owner = ${len(params)}"
    row = await conn.fetchrow(
        f"UPDATE workflow_runs SET {', '.join(assignments)} WHERE {guard} "
        f"RETURNING {RUN_COLUMNS}, event_seq, total_cost_cents",
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
    status: str = "PENDING",
) -> asyncpg.Record:
    row = await conn.fetchrow(
        "INSERT INTO step_runs (id, workflow_run_id, step_name, step_type, step_index, visit, attempt, status) "
        f"VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {STEP_COLUMNS}",
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
    return await conn.fetchrow(f"SELECT {RUN_COLUMNS} FROM workflow_runs WHERE id = $1", run_id)


async def get_step_run(conn: asyncpg.Connection | asyncpg.Pool, step_run_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {STEP_COLUMNS} FROM step_runs WHERE id = $1", step_run_id)


async def enqueue_webhooks(
    conn: asyncpg.Connection,
    workspace_id: str,
    event: str,
    data: dict[str, Any],
    *,
    at: datetime | None = None,
) -> None:
    """Outbox: one delivery row per active subscribed webhook, in the caller's transaction."""
    delivery_event_id = new_id("whevt")
    await conn.execute(
        "INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event, payload, status, next_attempt_at) "
        "SELECT 'whd_' || substr(md5(random()::text || w.id), 1, 24), w.id, w.workspace_id, $2::text, "
        "jsonb_build_object('id', $3::text, 'event', $2::text, 'createdAt', $4::text, 'data', $5::jsonb), "
        "'PENDING', now() "
        "FROM webhooks w WHERE w.workspace_id = $1 AND w.is_active AND w.events ? $2::text",
        workspace_id,
        event,
        delivery_event_id,
        iso(at or utcnow()),
        data,
    )
