"""API-key authentication, the admin token, and the first-key rules.

Keys are `stv_` + 32 lowercase alphanumerics; only their SHA-256 hex digest is stored.

Hot path: a lookup is cached in process for `KEY_CACHE_TTL_S` (0.25 s), including "no such
key", so a busy client costs at most four key queries per second per API process. Revoking through
this process evicts the entry at once; a key revoked through any other API process stops working
everywhere within 0.25 s (the guarantee docs/api/authentication.md states).
`last_used_at` is written at most once per `TOUCH_INTERVAL_S` (60 s) per key and process, and
the UPDATE itself skips rows touched in the last minute, so many processes add little load.
Keys that are not live count as failed attempts of the client's address (`failed_auth.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from stevora.db.reads import keys as key_reads
from stevora.errors import AuthError
from stevora.ids import random_token
from stevora.runtime import Runtime
from stevora.throttle.failed_auth import FailedAuthLimiter

KEY_PREFIX = "stv_"
KEY_CACHE_TTL_S = 0.25
TOUCH_INTERVAL_S = 60.0
_MAX_CACHED = 50_000
_TOUCH_GAP = timedelta(seconds=TOUCH_INTERVAL_S)
MISSING_KEY = "Missing x-api-key header"
INVALID_KEY = "Invalid or revoked API key"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the workspace every query is scoped to, and the key used (if any)."""

    workspace_id: str
    key_id: str | None = None


@dataclass(slots=True)
class _Cached:
    key_id: str | None  # None: no key with this hash
    workspace_id: str | None
    revoked: bool
    expires: float


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def new_api_key() -> str:
    return KEY_PREFIX + random_token(32)


class ApiKeyAuthenticator:
    def __init__(
        self,
        ttl_s: float = KEY_CACHE_TTL_S,
        touch_interval_s: float = TOUCH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        failures: FailedAuthLimiter | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.touch_interval_s = touch_interval_s
        self.clock = clock
        # Failed attempts per client address (stevora/throttle/failed_auth.py); shared with the UI.
        self.failures = failures if failures is not None else FailedAuthLimiter(0)
        self._cache: dict[str, _Cached] = {}
        self._touched: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Future[_Cached]] = {}

    async def authenticate(self, rt: Runtime, raw_key: str | None, address: str = "unknown") -> Principal:
        """The principal of a raw `x-api-key` value; `AuthError` when missing, unknown or revoked,
        `RateLimitError` while `address` has used up its failed attempts (no lookup then)."""
        if not raw_key:
            raise AuthError(MISSING_KEY)
        self.failures.check(address)
        if not raw_key.startswith(KEY_PREFIX) or len(raw_key) > 100:
            self.failures.take(address)
            raise AuthError(INVALID_KEY)
        digest = hash_key(raw_key)
        now = self.clock()
        entry = self._cache.get(digest)
        looked_up = False
        if entry is None or entry.expires <= now:
            # Only the request that queries spends an attempt up front (given back when the key
            # is good); requests sharing its lookup are counted below if the key is bad.
            looked_up = digest not in self._inflight
            if looked_up:
                self.failures.take(address)
            entry = await self._lookup_once(rt, digest, now)
        if entry.key_id is None or entry.workspace_id is None or entry.revoked:
            if not looked_up:
                self.failures.take(address)
            raise AuthError(INVALID_KEY)
        if looked_up:
            self.failures.give_back(address)
        if now - self._touched.get(entry.key_id, -self.touch_interval_s) >= self.touch_interval_s:
            self._touched[entry.key_id] = now
            await self._touch(rt, entry.key_id)
        return Principal(workspace_id=entry.workspace_id, key_id=entry.key_id)

    def forget(self, key_id: str) -> None:
        """Evict a key from the cache (after revoking it through this process)."""
        for digest, entry in list(self._cache.items()):
            if entry.key_id == key_id:
                del self._cache[digest]

    async def _lookup_once(self, rt: Runtime, digest: str, now: float) -> _Cached:
        """One database lookup per key at a time: when a cached entry expires under load, every
        concurrent request would otherwise query (and overflow the connection pool) at once."""
        pending = self._inflight.get(digest)
        if pending is None:
            pending = asyncio.ensure_future(self._lookup(rt, digest, now))
            self._inflight[digest] = pending
            pending.add_done_callback(lambda _: self._inflight.pop(digest, None))
        return await asyncio.shield(pending)

    async def _lookup(self, rt: Runtime, digest: str, now: float) -> _Cached:
        row = await key_reads.by_hash(rt.pool, digest)
        entry = _Cached(
            key_id=row.id if row else None,
            workspace_id=row.workspace_id if row else None,
            revoked=bool(row and row.revoked_at is not None),
            expires=now + self.ttl_s,
        )
        if len(self._cache) >= _MAX_CACHED:
            self._cache = {d: e for d, e in self._cache.items() if e.expires > now}
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
        self._cache[digest] = entry
        return entry

    async def _touch(self, rt: Runtime, key_id: str) -> None:
        await key_reads.touch(rt.pool, key_id, _TOUCH_GAP)
        if len(self._touched) > _MAX_CACHED:
            self._touched.clear()


def admin_token_matches(configured: str | None, given: str | None) -> bool:
    return (
        configured is not None
        and given is not None
        and hmac.compare_digest(configured.encode(), given.encode())
    )


def admin_token_accepted(
    configured: str | None, given: str, failures: FailedAuthLimiter, address: str
) -> bool:
    """`admin_token_matches`, with a wrong token counted as a failed attempt of `address`
    (`RateLimitError` once its attempts are used up, before comparing)."""
    failures.check(address)
    if admin_token_matches(configured, given):
        return True
    failures.take(address)
    return False


def require_admin_if_configured(
    configured: str | None, given: str | None, failures: FailedAuthLimiter, address: str
) -> None:
    """Workspace creation: open unless ADMIN_TOKEN is set, then `x-admin-token` must match it."""
    if configured is None:
        return
    if not given:
        raise AuthError("Missing x-admin-token header")
    if not admin_token_accepted(configured, given, failures, address):
        raise AuthError("Invalid admin token")
