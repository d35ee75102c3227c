"""Workflow definitions as the API's definition routes and the UI's definition pages read them, and
the API's insert (definitions are immutable: stored once, never updated). The engine's lookups by
id and by (name, version) are `stevora.db.definitions`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from stevora.db.reads.rows import Reader, Row, fetch, fetchrow, fetchval
from stevora.ids import new_id


@dataclass(frozen=True, slots=True)
class DefinitionRow(Row):
    """A `workflow_definitions` row, every column."""

    table: ClassVar[str] = "workflow_definitions"

    id: str
    workspace_id: str
    name: str
    version: str
    description: str | None
    steps: list[Any]
    input_schema: dict[str, Any] | None
    default_params: str | None
    budget: dict[str, Any] | None
    concurrency: dict[str, Any] | None
    priority: int | None
    schedule: dict[str, Any] | None
    triggers: list[Any] | None
    created_at: datetime
    updated_at: datetime


_COLUMNS = DefinitionRow.columns()
_SELECT = f"SELECT {_COLUMNS} FROM workflow_definitions WHERE workspace_id = $1"
# The values a new definition is stored with (the rest are the id, the workspace and defaults).
STORED_FIELDS = (
    "name",
    "version",
    "description",
    "steps",
    "input_schema",
    "default_params",
    "budget",
    "concurrency",
    "priority",
    "schedule",
    "triggers",
)
_INSERT = (
    f"INSERT INTO workflow_definitions (id, workspace_id, {', '.join(STORED_FIELDS)}) "
    f"VALUES ({', '.join(f'${i}' for i in range(1, len(STORED_FIELDS) + 3))}) "
    f"ON CONFLICT ON CONSTRAINT uq_definition_version DO NOTHING RETURNING {_COLUMNS}"
)


async def insert(db: Reader, workspace_id: str, values: dict[str, Any]) -> DefinitionRow | None:
    """The stored row, or None when (name, version) exists in the workspace (the unique index decides)."""
    args = [values.get(name) for name in STORED_FIELDS]
    return DefinitionRow.maybe(await db.fetchrow(_INSERT, new_id("wfdef"), workspace_id, *args))


async def get(db: Reader, workspace_id: str, definition_id: str) -> DefinitionRow | None:
    return DefinitionRow.maybe(await fetchrow(db, f"{_SELECT} AND id = $2", workspace_id, definition_id))


async def version(db: Reader, workspace_id: str, name: str, version: str) -> DefinitionRow | None:
    return DefinitionRow.maybe(
        await fetchrow(db, f"{_SELECT} AND name = $2 AND version = $3", workspace_id, name, version)
    )


async def count(db: Reader, workspace_id: str, name: str | None) -> int:
    if name is None:
        total: int = await fetchval(
            db, "SELECT count(*) FROM workflow_definitions WHERE workspace_id = $1", workspace_id
        )
    else:
        total = await fetchval(
            db,
            "SELECT count(*) FROM workflow_definitions WHERE workspace_id = $1 AND name = $2",
            workspace_id,
            name,
        )
    return total


async def page(
    db: Reader, workspace_id: str, name: str | None, *, offset: int, limit: int
) -> list[DefinitionRow]:
    """Newest first."""
    order = "ORDER BY created_at DESC, id DESC OFFSET $2 LIMIT $3"
    if name is None:
        rows = await fetch(db, f"{_SELECT} {order}", workspace_id, offset, limit)
    else:
        rows = await fetch(db, f"{_SELECT} AND name = $4 {order}", workspace_id, offset, limit, name)
    return DefinitionRow.all(rows)


# The versions a fork or replay with another model or prompt derives (`1.0.0+fork-<digest>`,
# stevora/engine/fork.py): one per edit, so lists of definitions leave them out; each run shows its own.
NOT_DERIVED = "version NOT LIKE '%+fork-%'"


async def derived_count(db: Reader, workspace_id: str) -> int:
    """How many definition versions forks and replays derived (left out of the lists)."""
    total: int = await fetchval(
        db,
        f"SELECT count(*) FROM workflow_definitions WHERE workspace_id = $1 AND NOT ({NOT_DERIVED})",
        workspace_id,
    )
    return total


@dataclass(frozen=True, slots=True)
class DefinitionRef(Row):
    id: str
    name: str
    version: str


async def ref(db: Reader, definition_id: str) -> DefinitionRef | None:
    """A definition's name and version (a run's definition: the run was scoped to its workspace)."""
    return DefinitionRef.maybe(
        await fetchrow(db, "SELECT id, name, version FROM workflow_definitions WHERE id = $1", definition_id)
    )


async def choices(db: Reader, workspace_id: str) -> list[DefinitionRef]:
    """The workspace's definitions by name, oldest version first, without the derived versions
    (the UI's pickers)."""
    rows = await fetch(
        db,
        f"SELECT id, name, version FROM workflow_definitions WHERE workspace_id = $1 AND {NOT_DERIVED} "
        "ORDER BY name, created_at",
        workspace_id,
    )
    return DefinitionRef.all(rows)


@dataclass(frozen=True, slots=True)
class DefinitionSummary(Row):
    """A definition with its step count, run count and last run (the UI's definitions page)."""

    id: str
    name: str
    version: str
    description: str | None
    created_at: datetime
    step_count: int
    run_count: int
    last_run_at: datetime | None


async def summaries(db: Reader, workspace_id: str) -> list[DefinitionSummary]:
    """Without the derived versions."""
    rows = await fetch(
        db,
        "SELECT d.id, d.name, d.version, d.description, d.created_at, "
        "jsonb_array_length(d.steps) AS step_count, "
        "(SELECT count(*) FROM workflow_runs r WHERE r.definition_id = d.id) AS run_count, "
        "(SELECT max(created_at) FROM workflow_runs r WHERE r.definition_id = d.id) AS last_run_at "
        f"FROM workflow_definitions d WHERE d.workspace_id = $1 AND d.{NOT_DERIVED} "
        "ORDER BY d.name, d.created_at DESC",
        workspace_id,
    )
    return DefinitionSummary.all(rows)
