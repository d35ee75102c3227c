"""Failed authentication is limited per client address, before it costs a database lookup.

A request with a key that is not a live key costs a query (`api_keys` by hash) each time, and a
guess that misses is as cheap for the client as any other request. So each client address has a
bucket of `per_minute` failures that refills at that many per minute; while it is empty, every
request from that address that presents a key (API `x-api-key`, the UI's cookie or login form, an
`x-admin-token`) answers 429 `RATE_LIMIT_ERROR` with `Retry-After`, and touches nothing.

Only failures empty the bucket. A lookup takes a token *before* it queries and gives it back when
the key turns out valid: so a flood of concurrent guesses cannot all pass the check before the
first fails, and a client with a good key never loses more than its lookups in flight. Requests
without any key are not attempts and are never counted.

The buckets are per process and in memory (at most `_MAX_ADDRESSES`; full buckets are forgotten),
so N API processes allow N times the limit: enough to bound the lookups, nothing to coordinate.
The address is the connection's peer as the ASGI server reports it; behind a reverse proxy that is
the client's only when uvicorn trusts the proxy's `X-Forwarded-For` (`FORWARDED_ALLOW_IPS`;
docs/api/authentication.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import HTTPConnection

from stevora.errors import RateLimitError

_MAX_ADDRESSES = 100_000
TOO_MANY_FAILURES = "Too many failed authentication attempts from this address"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


def client_address(connection: HTTPConnection) -> str:
    """The peer address of a request ("unknown" when the server gives none)."""
    return connection.client.host if connection.client is not None else "unknown"


class FailedAuthLimiter:
    """Per-address token buckets of failed authentication attempts; `per_minute` 0 disables."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.rate_per_s = per_minute / 60.0
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def check(self, address: str) -> None:
        """Raise `RateLimitError` while `address` has no failure left to spend."""
        if not self.enabled:
            return
        bucket = self._refilled(address)
        if bucket is not None and bucket.tokens < 1:
            retry_after_s = (1 - bucket.tokens) / self.rate_per_s
            raise RateLimitError(TOO_MANY_FAILURES, retry_after_s=retry_after_s)

    def take(self, address: str) -> None:
        """Spend one attempt: after `check` passed, before a lookup or on a failure."""
        if not self.enabled:
            return
        bucket = self._refilled(address)
        if bucket is None:
            if len(self._buckets) >= _MAX_ADDRESSES:
                self._forget_full()
            bucket = self._buckets[address] = _Bucket(self.capacity, self.clock())
        bucket.tokens -= 1

    def give_back(self, address: str) -> None:
        """Return the attempt a lookup took: the key was valid."""
        bucket = self._buckets.get(address)
        if bucket is not None:
            bucket.tokens = min(self.capacity, bucket.tokens + 1)

    def _refilled(self, address: str) -> _Bucket | None:
        bucket = self._buckets.get(address)
        if bucket is None:
            return None
        now = self.clock()
        bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.updated) * self.rate_per_s)
        bucket.updated = now
        return bucket

    def _forget_full(self) -> None:
        now = self.clock()
        self._buckets = {
            address: bucket
            for address, bucket in self._buckets.items()
            if bucket.tokens + (now - bucket.updated) * self.rate_per_s < self.capacity
        }
        if len(self._buckets) >= _MAX_ADDRESSES:
            self._buckets.clear()
