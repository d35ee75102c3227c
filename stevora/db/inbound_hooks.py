"""Inbound webhook endpoints' SQL (`inbound_hooks`). The secret is read only to verify."""

from __future__ import annotations

import asyncpg

from stevora.ids import new_id

PUBLIC_COLUMNS = "id, workspace_id, provider, event, created_at"


async def insert_hook(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, provider: str, event: str | None, secret: str
) -> asyncpg.Record:
    row = await conn.fetchrow(
        "INSERT INTO inbound_hooks (id, workspace_id, provider, event, secret) VALUES ($1, $2, $3, $4, $5) "
        f"RETURNING {PUBLIC_COLUMNS}",
        new_id("hook"),
        workspace_id,
        provider,
        event,
        secret,
    )
    assert row is not None
    return row


async def hook_with_secret(conn: asyncpg.Connection | asyncpg.Pool, hook_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {PUBLIC_COLUMNS}, secret FROM inbound_hooks WHERE id = $1", hook_id)


async def list_hooks(conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        f"SELECT {PUBLIC_COLUMNS} FROM inbound_hooks WHERE workspace_id = $1 ORDER BY created_at DESC, id DESC",
        workspace_id,
    )
    return list(rows)


async def delete_hook(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, hook_id: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"DELETE FROM inbound_hooks WHERE workspace_id = $1 AND id = $2 RETURNING {PUBLIC_COLUMNS}",
        workspace_id,
        hook_id,
    )
