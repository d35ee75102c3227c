"""A workspace's webhooks and their deliveries, as the API's webhook routes read and write them
(delivering is `stevora.webhooks`, the outbox `stevora.db.outbox`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import asyncpg

from stevora.db.reads.rows import Reader, Row, fetch, fetchval
from stevora.ids import new_id


@dataclass(frozen=True, slots=True)
class WebhookRow(Row):
    """A `webhooks` row, every column."""

    table: ClassVar[str] = "webhooks"

    id: str
    workspace_id: str
    url: str
    events: list[Any]
    secret: str
    is_active: bool
    created_at: datetime
    updated_at: datetime


_HOOK_COLUMNS = WebhookRow.columns()


# Counted under a transaction lock per workspace, so two creations at once cannot both pass.
_LOCK_WORKSPACE = "SELECT pg_advisory_xact_lock(hashtextextended('stevora.webhooks:' || $1, 0))"


async def insert_within_limit(
    pool: asyncpg.Pool, workspace_id: str, url: str, events: list[str], secret: str, limit: int
) -> tuple[WebhookRow | None, int]:
    """(the new webhook, or None when the workspace has `limit` webhooks already; the count before),
    within the workspace's limit (`STEVORA_WEBHOOKS_PER_WORKSPACE`)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(_LOCK_WORKSPACE, workspace_id)
        count: int = await conn.fetchval(
            "SELECT count(*) FROM webhooks WHERE workspace_id = $1", workspace_id
        )
        if count >= limit:
            return None, count
        row = await conn.fetchrow(
            "INSERT INTO webhooks (id, workspace_id, url, events, secret) VALUES ($1, $2, $3, $4, $5) "
            f"RETURNING {_HOOK_COLUMNS}",
            new_id("wh"),
            workspace_id,
            url,
            events,
            secret,
        )
        return WebhookRow.of(row), count


async def of_workspace(db: Reader, workspace_id: str) -> list[WebhookRow]:
    rows = await fetch(
        db,
        f"SELECT {_HOOK_COLUMNS} FROM webhooks WHERE workspace_id = $1 ORDER BY created_at, id",
        workspace_id,
    )
    return WebhookRow.all(rows)


async def delete(db: Reader, workspace_id: str, webhook_id: str) -> WebhookRow | None:
    """The deleted webhook (its deliveries go with it), or None when the workspace has none by that id."""
    return WebhookRow.maybe(
        await db.fetchrow(
            f"DELETE FROM webhooks WHERE id = $1 AND workspace_id = $2 RETURNING {_HOOK_COLUMNS}",
            webhook_id,
            workspace_id,
        )
    )


async def exists(db: Reader, workspace_id: str, webhook_id: str) -> bool:
    found: bool = await fetchval(
        db,
        "SELECT EXISTS (SELECT 1 FROM webhooks WHERE id = $1 AND workspace_id = $2)",
        webhook_id,
        workspace_id,
    )
    return found


@dataclass(frozen=True, slots=True)
class DeliveryRow(Row):
    """A `webhook_deliveries` row, every column."""

    table: ClassVar[str] = "webhook_deliveries"

    id: str
    webhook_id: str
    workspace_id: str
    event: str
    payload: dict[str, Any]
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    attempt_log: list[Any]
    delivered_at: datetime | None
    created_at: datetime
    updated_at: datetime


_STATUS = "($2::text IS NULL OR status = $2)"


async def delivery_count(db: Reader, webhook_id: str, status: str | None) -> int:
    total: int = await fetchval(
        db, f"SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1 AND {_STATUS}", webhook_id, status
    )
    return total


async def deliveries(
    db: Reader, webhook_id: str, status: str | None, *, offset: int, limit: int
) -> list[DeliveryRow]:
    """Newest first."""
    rows = await fetch(
        db,
        f"SELECT {DeliveryRow.columns()} FROM webhook_deliveries WHERE webhook_id = $1 AND {_STATUS} "
        "ORDER BY created_at DESC, id DESC OFFSET $3 LIMIT $4",
        webhook_id,
        status,
        offset,
        limit,
    )
    return DeliveryRow.all(rows)
