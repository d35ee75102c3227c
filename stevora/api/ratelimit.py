"""Per-workspace token buckets, in process.

Each workspace may burst up to `rate_limit_per_minute` requests and refills at that many per
minute. The buckets live in one API process: with N API processes behind a load balancer the
effective limit is up to N times the setting (documented in docs/api/authentication.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from stevora.errors import RateLimitError

_MAX_BUCKETS = 100_000


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.rate_per_s = per_minute / 60.0
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def hit(self, workspace_id: str) -> None:
        """Take one token or raise `RateLimitError` carrying the seconds until one is available."""
        if not self.enabled:
            return
        now = self.clock()
        bucket = self._buckets.get(workspace_id)
        if bucket is None:
            if len(self._buckets) >= _MAX_BUCKETS:
                self._forget_full(now)
            bucket = self._buckets[workspace_id] = _Bucket(self.capacity, now)
        else:
            bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.updated) * self.rate_per_s)
            bucket.updated = now
        if bucket.tokens < 1.0:
            raise RateLimitError(retry_after_s=(1.0 - bucket.tokens) / self.rate_per_s)
        bucket.tokens -= 1.0

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled completely: they are equivalent to no bucket."""
        for key, b in list(self._buckets.items()):
            if b.tokens + (now - b.updated) * self.rate_per_s >= self.capacity:
                del self._buckets[key]
