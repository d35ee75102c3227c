"""The memory store: per-workspace JSON documents under a namespace and a key, searched with
PostgreSQL full-text search (a generated `tsvector` over the documents' string values, GIN
index). Tools write through the checkpoint of their call (`apply` in its transaction); the API
reads and writes directly (docs/threads.md, "Memory store")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from stevora.db.reads.rows import Reader, fetch, fetchrow, fetchval

_COLUMNS = "namespace, key, value, created_at, updated_at"
_UNDER = "(namespace = $2 OR namespace LIKE replace(replace($2, '_', '\\_'), '%', '\\%') || '.%')"


async def put(
    db: Reader, workspace_id: str, namespace: str, key: str, value: dict[str, Any]
) -> asyncpg.Record:
    return await db.fetchrow(
        "INSERT INTO store_items (workspace_id, namespace, key, value) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (workspace_id, namespace, key) DO UPDATE SET value = EXCLUDED.value, updated_at = now() "
        f"RETURNING {_COLUMNS}",
        workspace_id,
        namespace,
        key,
        value,
    )


async def get(db: Reader, workspace_id: str, namespace: str, key: str) -> asyncpg.Record | None:
    return await fetchrow(
        db,
        f"SELECT {_COLUMNS} FROM store_items WHERE workspace_id = $1 AND namespace = $2 AND key = $3",
        workspace_id,
        namespace,
        key,
    )


async def delete(db: Reader, workspace_id: str, namespace: str, key: str) -> asyncpg.Record | None:
    return await db.fetchrow(
        f"DELETE FROM store_items WHERE workspace_id = $1 AND namespace = $2 AND key = $3 RETURNING {_COLUMNS}",
        workspace_id,
        namespace,
        key,
    )


async def search(
    db: Reader, workspace_id: str, namespace: str, query: str | None, *, offset: int = 0, limit: int = 10
) -> tuple[list[asyncpg.Record], int]:
    """Documents under `namespace` (itself and the namespaces below it) matching `query` (web
    search syntax: words, "quoted phrases", -excluded, or), best first; without a query, newest
    first. (the page, the total)"""
    if query:
        match = " AND search @@ websearch_to_tsquery('simple', $3)"
        rank = "ts_rank(search, websearch_to_tsquery('simple', $3))"
        args: list[Any] = [workspace_id, namespace, query]
    else:
        match, rank, args = "", "NULL::float4", [workspace_id, namespace]
    where = f"WHERE workspace_id = $1 AND {_UNDER}{match}"
    total: int = await fetchval(db, f"SELECT count(*) FROM store_items {where}", *args)
    order = "score DESC, updated_at DESC" if query else "updated_at DESC"
    rows = await fetch(
        db,
        f"SELECT {_COLUMNS}, {rank} AS score FROM store_items {where} "
        f"ORDER BY {order}, namespace, key OFFSET {int(offset)} LIMIT {int(limit)}",
        *args,
    )
    return rows, total


async def apply(
    conn: asyncpg.Connection, workspace_id: str, writes: Sequence[tuple[str, str, dict[str, Any] | None]]
) -> None:
    """A tool call's buffered writes (a None value deletes), in the caller's transaction."""
    for namespace, key, value in writes:
        if value is None:
            await delete(conn, workspace_id, namespace, key)
        else:
            await put(conn, workspace_id, namespace, key, value)
