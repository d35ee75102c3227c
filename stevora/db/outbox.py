"""The webhook outbox: a delivery row per subscribed webhook, written in the transaction of the
change it announces (delivered later by stevora.webhooks.delivery)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from stevora.clock import iso, utcnow
from stevora.events import WebhookEvent
from stevora.ids import new_id


async def enqueue_webhooks(
    conn: asyncpg.Connection,
    workspace_id: str,
    event: WebhookEvent,
    data: dict[str, Any],
    *,
    at: datetime | None = None,
) -> None:
    """One delivery row per active webhook subscribed to `event`, in the caller's transaction."""
    delivery_event_id = new_id("whevt")
    await conn.execute(
        "INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event, payload, status, next_attempt_at) "
        "SELECT 'whd_' || substr(md5(random()::text || w.id), 1, 24), w.id, w.workspace_id, $2::text, "
        "jsonb_build_object('id', $3::text, 'event', $2::text, 'createdAt', $4::text, 'data', $5::jsonb), "
        "'PENDING', now() "
        "FROM webhooks w WHERE w.workspace_id = $1 AND w.is_active AND w.events ? $2::text",
        workspace_id,
        str(event),
        delivery_event_id,
        iso(at or utcnow()),
        data,
    )
