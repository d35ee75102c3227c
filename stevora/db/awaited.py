"""Statements on awaited tool calls: calls whose result someone other than the loop writes (the API
caller for a client-executed tool, a child run for a workflow tool) or that wait for a person's
approval before they run. Callers own the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from stevora.ids import new_id
from stevora.statuses import TERMINAL_RUN_STATUSES, AwaitedKind, AwaitedStatus, RunStatus

_COLUMNS = (
    "a.id, a.workflow_run_id, a.step_run_id, a.llm_call_id, a.round, a.sequence, a.tool_call_id, a.tool_name, "
    "a.arguments, a.kind, a.status, a.deadline_at, a.child_run_id, a.created_at, a.parameters, "
    "a.approved_arguments"
)


@dataclass(slots=True)
class NewAwaitedCall:
    """A call the loop hands over; written when the step goes WAITING."""

    llm_call_id: str | None  # None for a `tool` step's call
    step_run_id: str
    round: int
    sequence: int
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    kind: AwaitedKind
    deadline_at: datetime | None = None
    parameters: dict[str, Any] | None = None  # approval: to check edited arguments against
    # workflow calls: the child run to create with it
    child_definition_id: str | None = None
    child_input: dict[str, Any] | None = None
    id: str = field(default_factory=lambda: new_id("atc"))


async def insert(conn: asyncpg.Connection, run_id: str, calls: Sequence[NewAwaitedCall]) -> set[str]:
    """Insert the calls not recorded yet; returns the ids actually inserted (a replayed round
    finds its rows already there and creates nothing twice)."""
    rows = await conn.fetch(
        "INSERT INTO awaited_tool_calls (id, workflow_run_id, step_run_id, llm_call_id, round, sequence, "
        "tool_call_id, tool_name, arguments, kind, deadline_at, parameters) "
        "SELECT a.id, $1, a.step_run_id, a.llm_call_id, a.round, a.sequence, a.tool_call_id, a.tool_name, "
        "a.arguments, a.kind, a.deadline_at, a.parameters "
        "FROM unnest($2::text[], $3::text[], $4::text[], $5::int[], $6::int[], $7::text[], $8::text[], "
        "$9::jsonb[], $10::text[], $11::timestamptz[], $12::jsonb[]) "
        "AS a(id, step_run_id, llm_call_id, round, sequence, tool_call_id, tool_name, arguments, kind, deadline_at, "
        "parameters) "
        # Replays find their row: per (model call, index), or per step run for a `tool` step.
        "ON CONFLICT DO NOTHING RETURNING id",
        run_id,
        [c.id for c in calls],
        [c.step_run_id for c in calls],
        [c.llm_call_id for c in calls],
        [c.round for c in calls],
        [c.sequence for c in calls],
        [c.tool_call_id for c in calls],
        [c.tool_name for c in calls],
        [c.arguments for c in calls],
        [c.kind for c in calls],
        [c.deadline_at for c in calls],
        [c.parameters for c in calls],
    )
    return {r["id"] for r in rows}


async def set_child(conn: asyncpg.Connection, awaited_id: str, child_run_id: str) -> None:
    await conn.execute(
        "UPDATE awaited_tool_calls SET child_run_id = $2 WHERE id = $1", awaited_id, child_run_id
    )


async def pending_for_run(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> list[asyncpg.Record]:
    """The calls a run waits for, in the model's order."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT {_COLUMNS} FROM awaited_tool_calls a WHERE a.workflow_run_id = $1 AND a.status = '{AwaitedStatus.PENDING}' "
        "ORDER BY a.round, a.sequence",
        run_id,
    )
    return rows


async def pending_client_calls(
    conn: asyncpg.Connection | asyncpg.Pool, run_ids: list[str]
) -> list[asyncpg.Record]:
    """Pending client-executed calls of several runs (the API's `requiredAction`)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT {_COLUMNS} FROM awaited_tool_calls a WHERE a.workflow_run_id = ANY($1::text[]) "
        f"AND a.status = '{AwaitedStatus.PENDING}' AND a.kind = '{AwaitedKind.CLIENT}' "
        "ORDER BY a.workflow_run_id, a.round, a.sequence",
        run_ids,
    )
    return rows


async def client_calls_with_results(conn: asyncpg.Connection, run_id: str) -> list[asyncpg.Record]:
    """Every client-executed call of the run, newest round first, with what was recorded for it."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT {_COLUMNS}, t.status AS trace_status, t.output_json, t.error AS trace_error, "
        "t.error_code AS trace_error_code "
        "FROM awaited_tool_calls a LEFT JOIN tool_trace t ON t.llm_call_id = a.llm_call_id AND t.sequence = a.sequence "
        f"WHERE a.workflow_run_id = $1 AND a.kind = '{AwaitedKind.CLIENT}' ORDER BY a.round DESC, a.sequence",
        run_id,
    )
    return rows


async def for_step_run(
    conn: asyncpg.Connection | asyncpg.Pool, step_run_ids: list[str]
) -> list[asyncpg.Record]:
    """Every awaited call of these step runs (approval decisions are looked up this way)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT {_COLUMNS} FROM awaited_tool_calls a WHERE a.step_run_id = ANY($1::text[])", step_run_ids
    )
    return rows


async def get(conn: asyncpg.Connection, awaited_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {_COLUMNS} FROM awaited_tool_calls a WHERE a.id = $1", awaited_id)


async def mark_approved(conn: asyncpg.Connection, awaited_id: str, arguments: Any) -> None:
    await conn.execute(
        f"UPDATE awaited_tool_calls SET status = '{AwaitedStatus.APPROVED}', approved_arguments = $2, "
        f"answered_at = now() WHERE id = $1 AND status = '{AwaitedStatus.PENDING}'",
        awaited_id,
        arguments,
    )


async def mark_answered(conn: asyncpg.Connection, awaited_ids: list[str]) -> None:
    await conn.execute(
        f"UPDATE awaited_tool_calls SET status = '{AwaitedStatus.ANSWERED}', answered_at = now() "
        f"WHERE id = ANY($1::text[]) AND status = '{AwaitedStatus.PENDING}'",
        awaited_ids,
    )


async def for_run_page(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> list[asyncpg.Record]:
    """Every awaited call of a run (model call, index, kind, tool-call id, child run, tool name, when
    it was handed over and answered): the run page links child runs, marks client calls and draws
    the waits in its waterfall with them."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT llm_call_id, sequence, kind, tool_call_id, child_run_id, tool_name, created_at, answered_at "
        "FROM awaited_tool_calls "
        "WHERE workflow_run_id = $1",
        run_id,
    )
    return rows


async def for_child(conn: asyncpg.Connection, child_run_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM awaited_tool_calls a WHERE a.child_run_id = $1", child_run_id
    )


async def unanswered_finished_children(pool: asyncpg.Pool, limit: int = 100) -> list[asyncpg.Record]:
    """Workflow calls whose child run has ended but whose answer was not written (the parent was
    busy, or an earlier ending could not reach it): the recovery sweep answers them."""
    rows: list[asyncpg.Record] = await pool.fetch(
        "SELECT a.child_run_id FROM awaited_tool_calls a JOIN workflow_runs c ON c.id = a.child_run_id "
        "JOIN workflow_runs p ON p.id = a.workflow_run_id "
        f"WHERE a.status = '{AwaitedStatus.PENDING}' AND a.kind = '{AwaitedKind.WORKFLOW}' "
        f"AND c.status = ANY($1::text[]) AND p.status = '{RunStatus.WAITING}' LIMIT $2",
        list(TERMINAL_RUN_STATUSES),
        limit,
    )
    return rows
