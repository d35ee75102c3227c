"""Workflow runs and their step runs, as the API, the UI and the CLI (through the API) read them:
every read is scoped to one workspace (a run's own rows are reached through a run of it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import asyncpg

from stevora.db.reads import events as event_reads
from stevora.db.reads import traces as trace_reads
from stevora.db.reads.rows import Reader, Row, fetch, fetchrow, fetchval, reading
from stevora.statuses import AwaitedKind, AwaitedStatus


@dataclass(frozen=True, slots=True)
class RunRow(Row):
    """A `workflow_runs` row, every column."""

    table: ClassVar[str] = "workflow_runs"
    table_alias: ClassVar[str] = "r"

    id: str
    workspace_id: str
    definition_id: str
    status: str
    current_step_name: str | None
    current_step_run_id: str | None
    input: dict[str, Any]
    state: dict[str, Any]
    output: dict[str, Any] | None
    error: dict[str, Any] | None
    total_cost_cents: float
    total_input_tokens: int
    total_output_tokens: int
    started_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    cancelled_at: datetime | None
    next_run_at: datetime | None
    idempotency_key: str | None
    version: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    dispatched_at: datetime | None
    event_seq: int
    parent_run_id: str | None
    parent_tool_call_id: str | None
    depth: int
    trace_context: dict[str, str] | None
    budget: dict[str, Any] | None
    initial_state: dict[str, Any] | None
    forked_from_run_id: str | None
    forked_at_step: str | None
    forked_at_round: int | None
    fork_edits: dict[str, Any] | None
    replay_of: str | None
    replay_tools: str | None
    crash_count: int
    concurrency_key: str | None
    concurrency_limit: int | None
    concurrency_hold_waiting: bool
    workspace_limit: int | None
    priority: int
    queued_at: datetime | None
    thread_id: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class RunListItem(RunRow):
    """A run of the API's list: a large JSON column over its share of the page is None, flagged;
    with its definition's name and version (which workflow each run is)."""

    input_omitted: bool | None
    state_omitted: bool | None
    output_omitted: bool | None
    definition_name: str
    definition_version: str


@dataclass(frozen=True, slots=True)
class RunWithDefinition(RunRow):
    """A run with its definition's name, version and steps (the UI's run page)."""

    definition_name: str
    definition_version: str
    definition_steps: list[Any]


@dataclass(frozen=True, slots=True)
class RunSummary(Row):
    """A run as lists show it, with its definition's name and version (the UI's lists, diff view)."""

    id: str
    status: str
    current_step_name: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    cancelled_at: datetime | None
    total_cost_cents: float
    total_input_tokens: int
    total_output_tokens: int
    definition_id: str
    definition_name: str
    definition_version: str
    concurrency_key: str | None
    queued_at: datetime | None
    forked_from_run_id: str | None
    forked_at_step: str | None
    forked_at_round: int | None
    replay_of: str | None


@dataclass(frozen=True, slots=True)
class StepRunRow(Row):
    """A `step_runs` row, every column."""

    table: ClassVar[str] = "step_runs"

    id: str
    workflow_run_id: str
    step_name: str
    step_type: str
    step_index: int
    visit: int
    attempt: int
    status: str
    input: dict[str, Any] | None
    output: dict[str, Any] | None
    error: dict[str, Any] | None
    signal_type: str | None
    state_updates: dict[str, Any] | None
    inherited_from: str | None
    wait_until: datetime | None
    started_at: datetime | None
    completed_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class RunFilters:
    """A runs list's search: a run id (or its prefix), status, definition (one version by id, or
    every version by name), parent run and a creation window (the API filters by status,
    definition and parent; the UI by the others too)."""

    run_id: str | None = None
    status: str | None = None
    definition_id: str | None = None
    definition_name: str | None = None
    parent_run_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None

    @property
    def active(self) -> bool:
        return any(getattr(self, name) is not None for name in self.__slots__)


_JOIN = "workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id"
_SUMMARY = (
    RunSummary.columns("r", skip=("definition_name", "definition_version"))
    + ", d.name AS definition_name, d.version AS definition_version"
)
_NEWEST_FIRST = "ORDER BY r.created_at DESC, r.id DESC"
# Each filter that is set adds its condition (only those: every combination is a plan of its own).
_CONDITIONS = (
    ("status", "r.status = {}"),
    ("definition_id", "r.definition_id = {}"),
    (
        "definition_name",
        "r.definition_id IN (SELECT id FROM workflow_definitions WHERE workspace_id = $1 AND name = {})",
    ),
    ("parent_run_id", "r.parent_run_id = {}"),
    ("run_id", "starts_with(r.id, {})"),
    ("created_from", "r.created_at >= {}"),
    ("created_to", "r.created_at < {}"),
)


def _where(workspace_id: str, filters: RunFilters) -> tuple[str, list[Any]]:
    """(`WHERE ...` over `r`, its arguments $1..$n)."""
    args: list[Any] = [workspace_id]
    conditions = ["r.workspace_id = $1"]
    for name, condition in _CONDITIONS:
        value = getattr(filters, name)
        if value is not None:
            args.append(value)
            conditions.append(condition.format(f"${len(args)}"))
    return "WHERE " + " AND ".join(conditions), args


async def get(db: Reader, workspace_id: str, run_id: str) -> RunRow | None:
    return RunRow.maybe(
        await fetchrow(
            db,
            f"SELECT {RunRow.columns('')} FROM workflow_runs WHERE id = $1 AND workspace_id = $2",
            run_id,
            workspace_id,
        )
    )


async def count(db: Reader, workspace_id: str, filters: RunFilters) -> int:
    where, args = _where(workspace_id, filters)
    total: int = await fetchval(db, f"SELECT count(*) FROM workflow_runs r {where}", *args)
    return total


LARGE_COLUMNS = ("input", "state", "output")


def _capped_columns(share_param: str) -> str:
    """The run's columns, each large JSON column NULL (and flagged) when its text is over the
    share: the database measures it, so an oversized value never leaves it."""
    columns = []
    for name in RunRow.names():
        if name not in LARGE_COLUMNS:
            columns.append(f"r.{name}")
            continue
        fits = f"octet_length(r.{name}::text) <= {share_param}"
        columns.append(f"CASE WHEN {fits} THEN r.{name} END AS {name}")
    columns += [f"NOT (octet_length(r.{n}::text) <= {share_param}) AS {n}_omitted" for n in LARGE_COLUMNS]
    columns += ["d.name AS definition_name", "d.version AS definition_version"]
    return ", ".join(columns)


async def page(
    db: Reader, workspace_id: str, filters: RunFilters, *, offset: int, limit: int, page_bytes: int
) -> list[RunListItem]:
    """Newest first, each large column capped at its share of `page_bytes` (a third per item)."""
    share = max(1, page_bytes // (len(LARGE_COLUMNS) * limit))
    where, args = _where(workspace_id, filters)
    n = len(args)
    sql = (
        f"SELECT {_capped_columns(f'${n + 1}::int')} FROM {_JOIN} {where} "
        f"{_NEWEST_FIRST} OFFSET ${n + 2} LIMIT ${n + 3}"
    )
    return RunListItem.all(await fetch(db, sql, *args, share, offset, limit))


async def summaries(
    db: Reader, workspace_id: str, filters: RunFilters, *, limit: int, offset: int
) -> list[RunSummary]:
    """Newest first."""
    where, args = _where(workspace_id, filters)
    sql = f"SELECT {_SUMMARY} FROM {_JOIN} {where} {_NEWEST_FIRST} LIMIT {int(limit)} OFFSET ${len(args) + 1}"
    return RunSummary.all(await fetch(db, sql, *args, offset))


async def summary(db: Reader, workspace_id: str, run_id: str) -> RunSummary | None:
    return RunSummary.maybe(
        await fetchrow(
            db,
            f"SELECT {_SUMMARY} FROM {_JOIN} WHERE r.id = $1 AND r.workspace_id = $2",
            run_id,
            workspace_id,
        )
    )


async def of_definition(db: Reader, workspace_id: str, definition_id: str, limit: int) -> list[RunSummary]:
    """The definition's latest runs, newest first."""
    rows = await fetch(
        db,
        f"SELECT {_SUMMARY} FROM {_JOIN} WHERE r.definition_id = $1 AND r.workspace_id = $2 "
        f"ORDER BY r.created_at DESC LIMIT {int(limit)}",
        definition_id,
        workspace_id,
    )
    return RunSummary.all(rows)


async def status(db: Reader, workspace_id: str, run_id: str) -> str | None:
    found: str | None = await fetchval(
        db, "SELECT status FROM workflow_runs WHERE id = $1 AND workspace_id = $2", run_id, workspace_id
    )
    return found


async def progress(db: Reader, workspace_id: str, run_id: str) -> tuple[str, int] | None:
    """(status, last event sequence) of the workspace's run."""
    row = await fetchrow(
        db,
        "SELECT status, event_seq FROM workflow_runs WHERE id = $1 AND workspace_id = $2",
        run_id,
        workspace_id,
    )
    return None if row is None else (row["status"], row["event_seq"])


async def settling(db: Reader, workspace_id: str, run_id: str) -> tuple[str, bool] | None:
    """(status, whether a client-executed tool call is pending) of the workspace's run."""
    row = await fetchrow(
        db,
        "SELECT r.status, EXISTS (SELECT 1 FROM awaited_tool_calls c WHERE c.workflow_run_id = r.id "
        f"AND c.status = '{AwaitedStatus.PENDING}' AND c.kind = '{AwaitedKind.CLIENT}') AS action "
        "FROM workflow_runs r WHERE r.id = $1 AND r.workspace_id = $2",
        run_id,
        workspace_id,
    )
    return None if row is None else (row["status"], row["action"])


_STEP_ORDER = "ORDER BY created_at, step_index, visit, attempt, id"


async def steps(db: Reader, run_id: str) -> list[StepRunRow]:
    """The run's step runs in the order they were created."""
    rows = await fetch(
        db, f"SELECT {StepRunRow.columns()} FROM step_runs WHERE workflow_run_id = $1 {_STEP_ORDER}", run_id
    )
    return StepRunRow.all(rows)


@dataclass(frozen=True, slots=True)
class RunPage:
    """Everything the UI's run page shows of one run, read on one connection."""

    run: RunWithDefinition
    steps: list[StepRunRow]
    calls: list[trace_reads.LlmCallRow]  # by round
    traces: list[trace_reads.ToolTraceRow]  # by round, sequence
    events: list[event_reads.EventRow]  # the last `events_shown`, oldest first
    events_total: int


_WITH_DEFINITION = (
    f"SELECT {RunRow.columns()}, d.name AS definition_name, d.version AS definition_version, "
    f"d.steps AS definition_steps FROM {_JOIN} WHERE r.id = $1 AND r.workspace_id = $2"
)


async def run_page(
    pool: asyncpg.Pool, workspace_id: str, run_id: str, *, events_shown: int
) -> RunPage | None:
    async def read(db: Reader) -> RunPage | None:
        async with _connection(db) as conn:
            run = RunWithDefinition.maybe(await conn.fetchrow(_WITH_DEFINITION, run_id, workspace_id))
            if run is None:
                return None
            return RunPage(
                run,
                await steps(conn, run_id),
                await trace_reads.calls_by_round(conn, run_id),
                await trace_reads.traces_by_round(conn, run_id),
                await event_reads.latest(conn, run_id, events_shown),
                await event_reads.count(conn, run_id),
            )

    return await reading(pool, read, "run_page")


@dataclass(frozen=True, slots=True)
class RunTrace:
    """One side of the diff view: the run, its model calls oldest first and its tool calls (the
    order `GET .../llm-calls` and `.../tool-traces` use)."""

    run: RunSummary
    calls: list[trace_reads.LlmCallRow]
    traces: list[trace_reads.ToolTraceRow]


async def run_trace(pool: asyncpg.Pool, workspace_id: str, run_id: str) -> RunTrace | None:
    async def read(db: Reader) -> RunTrace | None:
        async with _connection(db) as conn:
            run = await summary(conn, workspace_id, run_id)
            if run is None:
                return None
            return RunTrace(
                run, await trace_reads.calls(conn, run_id), await trace_reads.traces_by_round(conn, run_id)
            )

    return await reading(pool, read, "run_trace")


def _connection(db: Reader) -> Any:
    """`pool.acquire()` (a context manager yielding a connection)."""
    assert isinstance(db, asyncpg.Pool)
    return db.acquire()
