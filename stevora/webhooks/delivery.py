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
from stevora.webhooks.address import resolve_public

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


async def _post(client: httpx.AsyncClient, row: Any, addresses: list[str] | None = None) -> _Outcome:
    """POST the delivery; with `addresses`, to those (checked) addresses in turn instead of
    resolving the URL's host again, keeping the host name in `Host` and the TLS server name."""
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
        response = await _send_pinned(client, row["url"], body, headers, addresses)
    except Exception as exc:  # connection refused, timeout, bad URL, TLS: all retryable
        return _Outcome(None, f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS], _ms_since(started))
    error = None if 200 <= response.status_code < 300 else f"HTTP {response.status_code}: {response.text}"
    return _Outcome(response.status_code, error[:_ERROR_CHARS] if error else None, _ms_since(started))


async def _send_pinned(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], addresses: list[str] | None
) -> httpx.Response:
    if not addresses:
        return await client.post(url, content=body, headers=headers)
    target = httpx.URL(url)
    if target.host in addresses:  # an IP literal: nothing to resolve
        return await client.post(target, content=body, headers=headers)
    pinned_headers = {**headers, "host": target.netloc.decode("ascii")}
    # httpcore verifies the certificate against the SNI name, so TLS still checks the real host.
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    requests = [
        client.build_request(
            "POST",
            target.copy_with(host=address),
            content=body,
            headers=pinned_headers,
            extensions=extensions,
        )
        for address in addresses
    ]
    for request in requests[:-1]:
        try:
            return await client.send(request)
        except httpx.ConnectError:
            continue  # the next checked address, as a resolver-driven client would
    return await client.send(requests[-1])


async def _checked_post(rt: Runtime, client: httpx.AsyncClient, row: Any) -> _Outcome:
    """`_post` after checking, again, that the URL resolves to public addresses (DNS can change
    after the webhook was created), to exactly those addresses: no second resolution in between
    (see `stevora.webhooks.address`)."""
    if rt.settings.webhook_allow_private:
        return await _post(client, row)
    try:
        addresses = await resolve_public(row["url"])
    except ValueError as exc:
        return _Outcome(None, str(exc)[:_ERROR_CHARS], 0.0)
    return await _post(client, row, addresses)


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
    # No keep-alive: a pooled connection is keyed by the address it was opened to, and one opened
    # for (and TLS-verified as) one webhook's host must not carry another host's request.
    http = client or httpx.AsyncClient(
        timeout=rt.settings.webhook_timeout_s,
        follow_redirects=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )
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
