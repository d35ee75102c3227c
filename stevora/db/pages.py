"""The UI pages' reads (`stevora.ui.queries` assembles its read models from them): raw asyncpg
statements, every one scoped to one workspace (a run's own rows are reached through a run of it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

import asyncpg

from stevora.statuses import ApprovalStatus

Reader: TypeAlias = asyncpg.Connection | asyncpg.Pool

_RUNS_JOIN = "workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id"
_RUN_LIST_COLUMNS = (
    "r.id, r.status, r.current_step_name, r.created_at, r.started_at, r.completed_at, r.failed_at, "
    "r.cancelled_at, r.total_cost_cents, r.total_input_tokens, r.total_output_tokens, r.definition_id, "
    "d.name AS definition_name, d.version AS definition_version, r.concurrency_key, r.queued_at"
)


@dataclass(frozen=True, slots=True)
class RunFilters:
    """The runs list's search: a run id (or its prefix), status, definition and a creation window."""

    run_id: str | None = None
    status: str | None = None
    definition_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None

    @property
    def active(self) -> bool:
        return any(getattr(self, name) is not None for name in self.__slots__)


_RUNS_WHERE = (
    "r.workspace_id = $1 AND ($2::text IS NULL OR r.status = $2) "
    "AND ($3::text IS NULL OR r.definition_id = $3) "
    "AND ($4::text IS NULL OR starts_with(r.id, $4)) "
    "AND ($5::timestamptz IS NULL OR r.created_at >= $5) "
    "AND ($6::timestamptz IS NULL OR r.created_at < $6)"
)


def _run_args(workspace_id: str, filters: RunFilters) -> tuple[object, ...]:
    return (
        workspace_id,
        filters.status,
        filters.definition_id,
        filters.run_id,
        filters.created_from,
        filters.created_to,
    )


async def count_runs(db: Reader, workspace_id: str, filters: RunFilters) -> int:
    total: int = await db.fetchval(
        f"SELECT count(*) FROM workflow_runs r WHERE {_RUNS_WHERE}", *_run_args(workspace_id, filters)
    )
    return total


async def list_runs(
    db: Reader, workspace_id: str, filters: RunFilters, *, limit: int, offset: int
) -> list[asyncpg.Record]:
    """Newest first."""
    rows = await db.fetch(
        f"SELECT {_RUN_LIST_COLUMNS} FROM {_RUNS_JOIN} "
        f"WHERE {_RUNS_WHERE} ORDER BY r.created_at DESC, r.id DESC LIMIT {int(limit)} OFFSET $7",
        *_run_args(workspace_id, filters),
        offset,
    )
    return list(rows)


# The versions a fork or replay with another model or prompt derives (`1.0.0+fork-<digest>`,
# stevora/engine/fork.py): one per edit, so lists of definitions leave them out; each run shows its own.
NOT_DERIVED = "version NOT LIKE '%+fork-%'"


async def definition_choices(db: Reader, workspace_id: str) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            f"SELECT id, name, version FROM workflow_definitions WHERE workspace_id = $1 AND {NOT_DERIVED} "
            "ORDER BY name, created_at",
            workspace_id,
        )
    )


async def derived_definition_count(db: Reader, workspace_id: str) -> int:
    """How many definition versions forks and replays derived (left out of the lists)."""
    count: int = await db.fetchval(
        f"SELECT count(*) FROM workflow_definitions WHERE workspace_id = $1 AND NOT ({NOT_DERIVED})",
        workspace_id,
    )
    return count


@dataclass(frozen=True, slots=True)
class RunRows:
    """Everything the run page shows of one run, read on one connection."""

    run: asyncpg.Record  # with definition_name, definition_version, definition_steps
    steps: list[asyncpg.Record]  # in the order they were created
    calls: list[asyncpg.Record]  # llm_calls by round
    traces: list[asyncpg.Record]  # tool_trace by round, sequence
    events: list[asyncpg.Record]  # the last `events_shown`, oldest first
    events_total: int


async def run_rows(
    pool: asyncpg.Pool, workspace_id: str, run_id: str, *, events_shown: int
) -> RunRows | None:
    async with pool.acquire() as conn:
        run = await conn.fetchrow(
            "SELECT r.*, d.name AS definition_name, d.version AS definition_version, "
            f"d.steps AS definition_steps FROM {_RUNS_JOIN} "
            "WHERE r.id = $1 AND r.workspace_id = $2",
            run_id,
            workspace_id,
        )
        if run is None:
            return None
        steps = await conn.fetch(
            "SELECT * FROM step_runs WHERE workflow_run_id = $1 "
            "ORDER BY created_at, step_index, visit, attempt",
            run_id,
        )
        calls = await conn.fetch(
            "SELECT * FROM llm_calls WHERE workflow_run_id = $1 ORDER BY round, created_at", run_id
        )
        traces = await conn.fetch(
            "SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round, sequence", run_id
        )
        events = await conn.fetch(
            "SELECT * FROM (SELECT * FROM workflow_events WHERE workflow_run_id = $1 "
            f"ORDER BY sequence DESC LIMIT {int(events_shown)}) e ORDER BY sequence",
            run_id,
        )
        events_total = await conn.fetchval(
            "SELECT count(*) FROM workflow_events WHERE workflow_run_id = $1", run_id
        )
    return RunRows(run, list(steps), list(calls), list(traces), list(events), events_total)


@dataclass(frozen=True, slots=True)
class RunTrace:
    """One side of the diff view: the run (with its definition's name and version), its model
    calls oldest first and its tool calls (the order `GET .../llm-calls` and `.../tool-traces` use)."""

    run: asyncpg.Record
    calls: list[asyncpg.Record]
    traces: list[asyncpg.Record]


async def run_trace(pool: asyncpg.Pool, workspace_id: str, run_id: str) -> RunTrace | None:
    async with pool.acquire() as conn:
        run = await conn.fetchrow(
            f"SELECT {_RUN_LIST_COLUMNS}, r.forked_from_run_id, r.forked_at_step, r.forked_at_round, "
            f"r.replay_of FROM {_RUNS_JOIN} WHERE r.id = $1 AND r.workspace_id = $2",
            run_id,
            workspace_id,
        )
        if run is None:
            return None
        calls = await conn.fetch(
            "SELECT * FROM llm_calls WHERE workflow_run_id = $1 ORDER BY created_at, round, id", run_id
        )
        traces = await conn.fetch(
            "SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round, sequence", run_id
        )
    return RunTrace(run, list(calls), list(traces))


async def run_status(db: Reader, workspace_id: str, run_id: str) -> str | None:
    return await db.fetchval(  # type: ignore[no-any-return]
        "SELECT status FROM workflow_runs WHERE id = $1 AND workspace_id = $2", run_id, workspace_id
    )


async def events_after(db: Reader, run_id: str, after: int, *, limit: int = 500) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            "SELECT id, sequence, event_type, step_run_id, payload, created_at FROM workflow_events "
            f"WHERE workflow_run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT {int(limit)}",
            run_id,
            after,
        )
    )


_APPROVALS = (
    "SELECT a.*, r.status AS run_status, r.definition_id, "
    "d.name AS definition_name, d.version AS definition_version "
    "FROM approval_requests a JOIN workflow_runs r ON r.id = a.workflow_run_id "
    "JOIN workflow_definitions d ON d.id = r.definition_id WHERE a.workspace_id = $1 "
)


async def approvals(db: Reader, workspace_id: str) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    """Pending requests (oldest first, the order to work through them) and the 10 latest decided."""
    pending = await db.fetch(
        _APPROVALS + f"AND a.status = '{ApprovalStatus.PENDING}' ORDER BY a.created_at", workspace_id
    )
    decided = await db.fetch(
        _APPROVALS + f"AND a.status <> '{ApprovalStatus.PENDING}' ORDER BY a.updated_at DESC LIMIT 10",
        workspace_id,
    )
    return list(pending), list(decided)


async def pending_call_approvals(db: Reader, run_id: str) -> list[asyncpg.Record]:
    """The run's pending approval requests that gate tool calls: (request id, the call's id)."""
    return list(
        await db.fetch(
            "SELECT a.id, c.tool_call_id FROM approval_requests a "
            "JOIN awaited_tool_calls c ON c.id = a.awaited_tool_call_id "
            f"WHERE a.workflow_run_id = $1 AND a.status = '{ApprovalStatus.PENDING}'",
            run_id,
        )
    )


async def pending_run_approvals(db: Reader, run_id: str) -> list[asyncpg.Record]:
    """The run's pending approval requests, oldest first: (id, step name, the gated call's tool
    name and id when a tool call is what is approved)."""
    return list(
        await db.fetch(
            "SELECT a.id, a.step_name, c.tool_name, c.tool_call_id FROM approval_requests a "
            "LEFT JOIN awaited_tool_calls c ON c.id = a.awaited_tool_call_id "
            f"WHERE a.workflow_run_id = $1 AND a.status = '{ApprovalStatus.PENDING}' ORDER BY a.created_at",
            run_id,
        )
    )


async def pending_approval_count(db: Reader, workspace_id: str) -> int:
    return await db.fetchval(  # type: ignore[no-any-return]
        f"SELECT count(*) FROM approval_requests WHERE workspace_id = $1 AND status = '{ApprovalStatus.PENDING}'",
        workspace_id,
    )


async def approval_run_id(db: Reader, workspace_id: str, approval_id: str) -> str | None:
    return await db.fetchval(  # type: ignore[no-any-return]
        "SELECT workflow_run_id FROM approval_requests WHERE id = $1 AND workspace_id = $2",
        approval_id,
        workspace_id,
    )


async def definitions(db: Reader, workspace_id: str) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            "SELECT d.id, d.name, d.version, d.description, d.created_at, "
            "jsonb_array_length(d.steps) AS step_count, "
            "(SELECT count(*) FROM workflow_runs r WHERE r.definition_id = d.id) AS run_count, "
            "(SELECT max(created_at) FROM workflow_runs r WHERE r.definition_id = d.id) AS last_run_at "
            f"FROM workflow_definitions d WHERE d.workspace_id = $1 AND d.{NOT_DERIVED} "
            "ORDER BY d.name, d.created_at DESC",
            workspace_id,
        )
    )


async def definition(
    db: Reader, workspace_id: str, definition_id: str
) -> tuple[asyncpg.Record, list[asyncpg.Record]] | None:
    """A definition of the workspace and its 10 latest runs."""
    row = await db.fetchrow(
        "SELECT * FROM workflow_definitions WHERE id = $1 AND workspace_id = $2", definition_id, workspace_id
    )
    if row is None:
        return None
    runs = await db.fetch(
        f"SELECT {_RUN_LIST_COLUMNS} FROM {_RUNS_JOIN} "
        "WHERE r.definition_id = $1 AND r.workspace_id = $2 ORDER BY r.created_at DESC LIMIT 10",
        definition_id,
        workspace_id,
    )
    return row, list(runs)


async def ui_user(db: Reader, key_hash: str) -> asyncpg.Record | None:
    """The active API key with this hash and its workspace (a UI login)."""
    return await db.fetchrow(
        "SELECT k.id, k.workspace_id, k.name AS key_name, k.key_prefix, w.name AS workspace_name "
        "FROM api_keys k JOIN workspaces w ON w.id = k.workspace_id "
        "WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
        key_hash,
    )
