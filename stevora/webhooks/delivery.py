"""Deliver webhook outbox rows: claim due rows, POST them signed, record every attempt.

The engine inserts one `webhook_deliveries` row per subscribed webhook in the same transaction as
the change it announces (`stevora.db.outbox.enqueue_webhooks`), so an event is never lost and
never announced for a change that rolled back. The sweep calls `deliver_due` periodically.

Delivery is at-least-once: a claim is a lease (`next_attempt_at` pushed past the HTTP timeout),
taken with `FOR UPDATE SKIP LOCKED` so two sweepers never send the same row at once; a process
that dies mid-send leaves the row to be retried when the lease runs out. Receivers deduplicate
with the `x-stevora-delivery` header.

Request: `POST <url>` with the raw JSON body `{id, event, createdAt, data}` and headers
`x-stevora-event`, `x-stevora-delivery` (delivery id), `x-stevora-timestamp` (unix seconds),
`x-stevora-signature: sha256=<hex HMAC-SHA256(secret, f"{timestamp}.{body}")>`.
A 2xx answer delivers; anything else (or no answer within `webhook_timeout_s`) is retried after
`min(2^attempts s, 1 h)` ±25 % jitter, and the row is FAILED after `webhook_max_attempts`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
import structlog

from stevora.clock import iso, utcnow
from stevora.db import outbox
from stevora.observability.metrics import WEBHOOK_FAILURES
from stevora.webhooks.address import check_webhook_url

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.webhooks")

MAX_BACKOFF_S = 3600.0
LEASE_MARGIN_S = 30.0
CONCURRENCY = 16
_ERROR_CHARS = 500


def sign(secret: str, timestamp: int | str, body: bytes | str) -> str:
    """The `x-stevora-signature` value: `sha256=` + hex HMAC-SHA256 of `f"{timestamp}.{body}"`."""
    raw = body if isinstance(body, bytes) else body.encode()
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(
    secret: str, timestamp: int | str, body: bytes | str, header: str, tolerance_s: float = 300
) -> bool:
    """For receivers: does `header` sign this exact raw `body` and a `timestamp` within
    `tolerance_s` of now? (The tolerance stops replays of old captured requests.)"""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, ts, body), header.strip())


def next_delay_s(attempts: int, rand: float | None = None) -> float:
    """Seconds before the next try, after `attempts` failed tries: min(2^attempts, 3600) ±25 %."""
    base = min(2.0 ** min(attempts, 32), MAX_BACKOFF_S)
    jitter = 0.75 + 0.5 * (random.random() if rand is None else rand)
    return base * jitter


@dataclass(frozen=True, slots=True)
class _Outcome:
    status_code: int | None
    error: str | None
    duration_ms: float

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


async def _post(client: httpx.AsyncClient, row: Any) -> _Outcome:
    body = json.dumps(row["payload"], separators=(",", ":"), ensure_ascii=False).encode()
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "user-agent": "Stevora-Webhooks/1",
        "x-stevora-event": row["event"],
        "x-stevora-delivery": row["id"],
        "x-stevora-timestamp": str(timestamp),
        "x-stevora-signature": sign(row["secret"], timestamp, body),
    }
    started = time.perf_counter()
    try:
        response = await client.post(row["url"], content=body, headers=headers)
    except Exception as exc:  # connection refused, timeout, bad URL, TLS: all retryable
        return _Outcome(None, f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS], _ms_since(started))
    error = None if 200 <= response.status_code < 300 else f"HTTP {response.status_code}: {response.text}"
    return _Outcome(response.status_code, error[:_ERROR_CHARS] if error else None, _ms_since(started))


async def _checked_post(rt: Runtime, client: httpx.AsyncClient, row: Any) -> _Outcome:
    """`_post` after checking, again, that the URL resolves to a public address: DNS can change
    after the webhook was created (see `stevora.webhooks.address`)."""
    try:
        await check_webhook_url(row["url"], allow_private=rt.settings.webhook_allow_private)
    except ValueError as exc:
        return _Outcome(None, str(exc)[:_ERROR_CHARS], 0.0)
    return await _post(client, row)


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


async def _record(rt: Runtime, row: Any, outcome: _Outcome) -> None:
    attempt = row["attempts"] + 1
    if outcome.delivered:
        status, next_at = "DELIVERED", None
    elif attempt >= rt.settings.webhook_max_attempts:
        status, next_at = "FAILED", None
    else:
        status, next_at = "PENDING", utcnow() + timedelta(seconds=next_delay_s(attempt))
    entry = {
        "attempt": attempt,
        "at": iso(utcnow()),
        "statusCode": outcome.status_code,
        "error": outcome.error,
        "durationMs": outcome.duration_ms,
    }
    await outbox.record_attempt(
        rt.pool, row["id"], status, next_at, outcome.status_code, outcome.error, entry
    )
    if not outcome.delivered:
        WEBHOOK_FAILURES.labels(final=str(status == "FAILED").lower()).inc()
    log.info(
        "webhook_attempted",
        delivery_id=row["id"],
        webhook_event=row["event"],
        attempt=attempt,
        status=status,
        status_code=outcome.status_code,
    )


async def deliver_due(rt: Runtime, *, limit: int = 100, client: httpx.AsyncClient | None = None) -> int:
    """Send every due PENDING delivery (up to `limit`); returns how many attempts were made."""
    lease_s = rt.settings.webhook_timeout_s + LEASE_MARGIN_S
    rows = await outbox.claim_due(rt.pool, limit, lease_s)
    if not rows:
        return 0
    owned = client is None
    http = client or httpx.AsyncClient(timeout=rt.settings.webhook_timeout_s, follow_redirects=False)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(row: Any) -> None:
        async with gate:
            if not row["is_active"]:
                outcome = _Outcome(None, "Webhook is inactive", 0.0)
            else:
                outcome = await _checked_post(rt, http, row)
            await _record(rt, row, outcome)

    try:
        await asyncio.gather(*(one(row) for row in rows))
    finally:
        if owned:
            await http.aclose()
    return len(rows)
