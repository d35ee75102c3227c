"""The webhook outbox: a delivery row per subscribed webhook, written in the transaction of the
change it announces, and the statements that deliver it (used by stevora.webhooks.delivery)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from stevora.clock import iso, utcnow
from stevora.events import WebhookEvent
from stevora.ids import new_id

# Pending deliveries one webhook may have (docs/api/webhooks.md, "Limits"): past it, an event's
# delivery to that webhook is written FAILED with BACKLOG_FULL and never sent, so an endpoint that
# is down (or a workspace that subscribed many) cannot grow the queue without bound.
BACKLOG_PER_WEBHOOK = 1000
BACKLOG_FULL = "BACKLOG_FULL"
_BACKLOG_FULL_SQL = (
    "(SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries p WHERE p.webhook_id = w.id "
    f"AND p.status = 'PENDING' LIMIT {BACKLOG_PER_WEBHOOK}) b) >= {BACKLOG_PER_WEBHOOK}"
)
BACKLOG_FULL_ERROR = (
    f"{BACKLOG_FULL}: the webhook already had {BACKLOG_PER_WEBHOOK} deliveries pending; this one was not sent"
)


def deliveries_sql(
    *, workspace: str, event: str, event_id: str, created_at: str, data: str, source: str = ""
) -> str:
    """`INSERT ... SELECT` of one delivery row per active webhook subscribed to `event`: PENDING, or
    FAILED with `BACKLOG_FULL` for a webhook with `BACKLOG_PER_WEBHOOK` deliveries pending.

    Each argument is a SQL expression (a `$n` placeholder or a column of `source`, an extra
    `FROM` item such as a CTE), so a single statement can announce the change it makes."""
    return (
        "INSERT INTO webhook_deliveries "
        "(id, webhook_id, workspace_id, event, payload, status, next_attempt_at, last_error) "
        f"SELECT 'whd_' || substr(md5(random()::text || w.id), 1, 24), w.id, w.workspace_id, {event}, "
        f"jsonb_build_object('id', {event_id}, 'event', {event}, 'createdAt', {created_at}, 'data', {data}), "
        "CASE WHEN q.backlog_full THEN 'FAILED' ELSE 'PENDING' END, CASE WHEN q.backlog_full THEN NULL ELSE now() END, "
        f"CASE WHEN q.backlog_full THEN '{BACKLOG_FULL_ERROR}' END "
        f"FROM {source}{', ' if source else ''}webhooks w CROSS JOIN LATERAL (SELECT {_BACKLOG_FULL_SQL} AS backlog_full) q "
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


# -- delivery (stevora.webhooks.delivery) ----------------------------------------------------

CLAIM_SQL = """
UPDATE webhook_deliveries d
SET next_attempt_at = now() + make_interval(secs => $2), updated_at = now()
FROM webhooks w
WHERE d.id IN (
    SELECT id FROM webhook_deliveries
    WHERE status = 'PENDING' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
AND w.id = d.webhook_id
RETURNING d.id, d.event, d.payload, d.attempts, w.url, w.secret, w.is_active
"""

RECORD_SQL = """
UPDATE webhook_deliveries
SET status = $2::text, attempts = attempts + 1, next_attempt_at = $3, last_status_code = $4, last_error = $5,
    attempt_log = attempt_log || jsonb_build_array($6::jsonb),
    delivered_at = CASE WHEN $2::text = 'DELIVERED' THEN now() ELSE delivered_at END,
    updated_at = now()
WHERE id = $1 AND status = 'PENDING'
"""


async def claim_due(pool: asyncpg.Pool, limit: int, lease_s: float) -> list[asyncpg.Record]:
    """Due PENDING deliveries (up to `limit`), leased for `lease_s` so no other sweeper sends them
    meanwhile, with their webhook's url, secret and whether it is active."""
    return list(await pool.fetch(CLAIM_SQL, limit, lease_s))


async def record_attempt(
    pool: asyncpg.Pool,
    delivery_id: str,
    status: str,
    next_attempt_at: datetime | None,
    status_code: int | None,
    error: str | None,
    entry: dict[str, Any],
) -> None:
    """One attempt's outcome: the new status, the next try, and `entry` appended to the log."""
    await pool.execute(RECORD_SQL, delivery_id, status, next_attempt_at, status_code, error, entry)
