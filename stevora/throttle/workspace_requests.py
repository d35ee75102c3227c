"""Per-workspace token buckets shared by every API process, in PostgreSQL.

Each workspace may burst up to `rate_limit_per_minute` requests and refills at that many per
minute — across all API processes together, since the bucket is one row
(`rate_limit_buckets`) updated under its row lock.

Hot path: a process does not write that row per request. It claims tokens from the shared bucket
in small batches (`batch`, 1 for small limits, at most 50) and spends them locally; the row is
touched once per batch. Claimed tokens are already taken from the shared bucket, so N processes
never admit more than the limit allows; a process that goes quiet may strand at most `batch - 1`
tokens, which the bucket refills within `batch / rate` seconds. A batch expires after
`BATCH_TTL_S` so stranded tokens are not spent long after they were claimed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from stevora.db import workspace_requests as buckets
from stevora.errors import RateLimitError

if TYPE_CHECKING:
    from stevora.runtime import Runtime

_MAX_LOCAL = 100_000
MAX_BATCH = 50
BATCH_TTL_S = 1.0


@dataclass(slots=True)
class _Local:
    tokens: int
    expires: float


class RateLimiter:
    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.rate_per_s = per_minute / 60.0
        self.batch = max(1, min(MAX_BATCH, per_minute // 200))
        self.clock = clock
        self._local: dict[str, _Local] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    async def hit(self, rt: Runtime, workspace_id: str) -> None:
        """Take one token or raise `RateLimitError` carrying the seconds until one is available."""
        if not self.enabled or self._take_local(workspace_id):
            return
        lock = self._locks.get(workspace_id)
        if lock is None:
            if len(self._locks) >= _MAX_LOCAL:
                self._locks.clear()
            lock = self._locks[workspace_id] = asyncio.Lock()
        async with lock:  # one claim per workspace at a time; the others reuse its batch
            if self._take_local(workspace_id):
                return
            granted, remaining = await self._claim(rt, workspace_id)
            if granted < 1:
                raise RateLimitError(retry_after_s=max(0.0, 1.0 - remaining) / self.rate_per_s)
            if len(self._local) >= _MAX_LOCAL:
                self._local.clear()
            self._local[workspace_id] = _Local(granted - 1, self.clock() + BATCH_TTL_S)

    def _take_local(self, workspace_id: str) -> bool:
        local = self._local.get(workspace_id)
        if local is None or local.tokens < 1 or local.expires <= self.clock():
            return False
        local.tokens -= 1
        return True

    async def _claim(self, rt: Runtime, workspace_id: str) -> tuple[int, float]:
        row = await buckets.claim(rt.pool, workspace_id, self.capacity, self.rate_per_s, self.batch)
        if row is None:  # the workspace's first request: a full bucket, then claim from it
            try:
                await buckets.create(rt.pool, workspace_id, self.capacity)
            except asyncpg.ForeignKeyViolationError:
                return 1, 0.0  # no such workspace: the request itself answers 404
            row = await buckets.claim(rt.pool, workspace_id, self.capacity, self.rate_per_s, self.batch)
        assert row is not None
        return int(row["granted"]), float(row["remaining"])
