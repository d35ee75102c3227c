"""Creating a webhook within the workspace's limit (`STEVORA_WEBHOOKS_PER_WORKSPACE`)."""

from __future__ import annotations

import asyncpg

from stevora.ids import new_id

_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('stevora.webhooks:' || $1, 0))"
_COUNT_SQL = "SELECT count(*) FROM webhooks WHERE workspace_id = $1"
_INSERT_SQL = (
    "INSERT INTO webhooks (id, workspace_id, url, events, secret) VALUES ($1, $2, $3, $4::jsonb, $5) "
    "RETURNING id, workspace_id, url, events, secret, is_active, created_at, updated_at"
)


async def insert_within_limit(
    pool: asyncpg.Pool, workspace_id: str, url: str, events: list[str], secret: str, limit: int
) -> tuple[asyncpg.Record | None, int]:
    """(the new webhook, or None when the workspace has `limit` webhooks already; the count before).

    Counted under a transaction lock per workspace, so two creations at once cannot both pass."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(_LOCK_SQL, workspace_id)
        count: int = await conn.fetchval(_COUNT_SQL, workspace_id)
        if count >= limit:
            return None, count
        row = await conn.fetchrow(_INSERT_SQL, new_id("wh"), workspace_id, url, events, secret)
        return row, count
