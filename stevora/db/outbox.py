"""The webhook outbox: a delivery row per subscribed webhook, written in the transaction of the
change it announces (delivered later by stevora.webhooks.delivery)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from stevora.clock import iso, utcnow
from stevora.events import WebhookEvent
from stevora.ids import new_id


def deliveries_sql(
    *, workspace: str, event: str, event_id: str, created_at: str, data: str, source: str = ""
) -> str:
    """`INSERT ... SELECT` of one delivery row per active webhook subscribed to `event`.

    Each argument is a SQL expression (a `$n` placeholder or a column of `source`, an extra
    `FROM` item such as a CTE), so a single statement can announce the change it makes."""
    return (
        "INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event, payload, status, next_attempt_at) "
        f"SELECT 'whd_' || substr(md5(random()::text || w.id), 1, 24), w.id, w.workspace_id, {event}, "
        f"jsonb_build_object('id', {event_id}, 'event', {event}, 'createdAt', {created_at}, 'data', {data}), "
        f"'PENDING', now() FROM {source}{', ' if source else ''}webhooks w "
        f"WHERE w.workspace_id = {workspace} AND w.is_active AND w.events ? {event}"
    )


_ENQUEUE_SQL = deliveries_sql(
    workspace="$1", event="$2::text", event_id="$3::text", created_at="$4::text", data="$5::jsonb"
)


async def enqueue_webhooks(
    conn: asyncpg.Connection,
    workspace_id: str,
    event: WebhookEvent,
    data: dict[str, Any],
    *,
    at: datetime | None = None,
) -> None:
    """One delivery row per active webhook subscribed to `event`, in the caller's transaction."""
    await conn.execute(_ENQUEUE_SQL, workspace_id, str(event), new_id("whevt"), iso(at or utcnow()), data)
