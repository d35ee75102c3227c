"""Lookups of stored workflow definitions: by id (`stevora.runtime.DefinitionCache` caches the
parsed result), by name (workflows called as tools)."""

from __future__ import annotations

from typing import Any

import asyncpg

from stevora.definitions import parse_default_params

_COLUMNS = (
    "id, name, version, description, steps, input_schema, default_params, budget, concurrency, priority, "
    "created_at"
)


async def get(conn: asyncpg.Connection | asyncpg.Pool, definition_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {_COLUMNS}, workspace_id FROM workflow_definitions WHERE id = $1", definition_id
    )


async def name_of(conn: asyncpg.Connection | asyncpg.Pool, definition_id: str) -> str | None:
    return await conn.fetchval("SELECT name FROM workflow_definitions WHERE id = $1", definition_id)  # type: ignore[no-any-return]


async def find_version(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, name: str, version: str | None
) -> asyncpg.Record | None:
    """The definition `name` at `version`, or its newest version (the most recently created)."""
    if version is not None:
        return await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM workflow_definitions WHERE workspace_id = $1 AND name = $2 AND version = $3",
            workspace_id,
            name,
            version,
        )
    return await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM workflow_definitions WHERE workspace_id = $1 AND name = $2 "
        "ORDER BY created_at DESC, id DESC LIMIT 1",
        workspace_id,
        name,
    )


def workflow_input_schema(row: Any) -> dict[str, Any] | None:
    """A stored definition's input schema: `input_schema`, else the one `default_params` describes."""
    if row["input_schema"] is not None:
        return dict(row["input_schema"])
    if row["default_params"] is not None:
        return parse_default_params(row["default_params"])
    return None
