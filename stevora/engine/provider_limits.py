"""Provider rate limits shared by every worker (`STEVORA_RATE_LIMITS`, docs/flow-control.md).

A model with a configured limit has one row of buckets in PostgreSQL (`stevora.db.provider_limits`).
Before its call is sent, a `LimitedProvider` reserves one request and the call's estimated tokens
with one statement and sleeps until its turn; a turn further away than the bound (the fallback bound
when the step has a next model, else `STEVORA_RATE_LIMIT_MAX_WAIT_S`) is not reserved and the call
fails with a retryable `RATE_LIMITED` instead of being sent: the step's next fallback model is tried,
or the attempt is retried no earlier than the turn (the run then holds no worker). The estimate
(characters / 4 of the prompt + `max_tokens`) is corrected from the answer's usage at this
process's next reservation; a provider 429 lowers the shared buckets to what its headers say and
shrinks the limits in force (`scale`), which answered calls restore.

The model caller wraps a provider only when its model has a limit (`wrap`, once per step visit),
so without `STEVORA_RATE_LIMITS` no model call pays anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from stevora.db import provider_limits as db
from stevora.db.reads.rows import DbRow
from stevora.errors import ProviderError
from stevora.llm.messages import LlmRequest, LlmResponse
from stevora.llm.provider import UNDER_SHARED_LIMIT, Provider
from stevora.observability import hooks as observe
from stevora.observability import metrics
from stevora.settings import ProviderRateLimit, Settings

if TYPE_CHECKING:
    from stevora.runtime import Runtime

RATE_LIMITED = "RATE_LIMITED"
# A provider 429 multiplies the limits in force by this, down to the floor; each reservation gives
# back `RECOVER` of the full limits (a hundred answered calls undo one shrink).
SHRINK = 0.8
LOWEST_SCALE = 0.25
RECOVER = 0.002
_UNLIMITED = 1e12  # a bucket that never binds (a limit on requests only, or tokens only)
# The shared buckets hold this share of a window, the rate is the full limit. Calls granted but
# still on their way (a busy worker, the network) let the provider's bucket fill up and lose the
# refill ours counted on; the rest of the window covers them (measured: bench/provider_limits.py).
BURST = 0.9


async def deferred_too_often(
    pool: asyncpg.Pool, settings: Settings, step_run: DbRow, error: dict[str, object]
) -> dict[str, object] | None:
    """A step visit the rate limit has deferred `STEVORA_RATE_LIMIT_MAX_DEFERRALS` times stops
    being retried at its turn: the error that fails the run then (not retryable), else None.
    Permanent overload ends runs with a reason instead of deferring them for ever."""
    count = await db.deferrals(pool, step_run)
    if count < settings.rate_limit_max_deferrals:
        return None
    return {
        **error,
        "retryable": False,
        "message": f"The provider rate limit deferred this step {count} times without a turn "
        f"(STEVORA_RATE_LIMIT_MAX_DEFERRALS={settings.rate_limit_max_deferrals}); last: {error.get('message')}",
    }


@dataclass(frozen=True)
class Budget:
    """One configured limit, as the bucket statement takes it."""

    key: str
    capacity: tuple[float, float]  # requests, tokens
    per_s: tuple[float, float]

    @classmethod
    def of(cls, key: str, limit: ProviderRateLimit, window_s: float) -> Budget:
        requests = float(limit.rpm) if limit.rpm is not None else _UNLIMITED
        tokens = float(limit.tpm) if limit.tpm is not None else _UNLIMITED
        # At least one call's worth, or a limit of one request per window would never grant one.
        capacity = (max(1.0, requests * BURST), tokens * BURST)
        return cls(key, capacity, (requests / window_s, tokens / window_s))


def estimate_tokens(request: LlmRequest) -> int:
    """Characters / 4 of the prompt (texts and tool-call arguments) plus the answer's `max_tokens`."""
    chars = 0
    for m in request.messages:
        chars += len(m.content or "")
        for call in m.tool_calls:
            chars += len(call.arguments)
    return chars // 4 + (request.max_tokens or 0)


def of(rt: Runtime) -> ProviderLimits:
    """The runtime's limits (made at first use; only asked when `STEVORA_RATE_LIMITS` is set)."""
    if isinstance(rt.provider_limits, ProviderLimits):
        return rt.provider_limits
    limits = rt.provider_limits = ProviderLimits.from_settings(rt)
    return limits


class ProviderLimits:
    """The configured budgets and this process's pending corrections; one per runtime."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        limits: Mapping[str, ProviderRateLimit],
        *,
        window_s: float = 60.0,
        fallback_after_s: float = 10.0,
        max_wait_s: float = 60.0,
        known_name: Callable[[str, str], str | None] = lambda _p, _m: None,
        resends_after_429: int = 0,
    ) -> None:
        self.pool = pool
        # How often a call refused with a 429 is sent again, each time at its next turn.
        self.resends_after_429 = resends_after_429
        self.known_name = known_name  # `Pricing.known_name`: the metric's model label
        self.budgets = {key: Budget.of(key, limit, window_s) for key, limit in limits.items()}
        self.fallback_after_s = fallback_after_s
        self.max_wait_s = max_wait_s
        # Tokens reserved beyond what answered calls used, given back at the next reservation.
        self._given_back: dict[str, float] = {}

    @classmethod
    def from_settings(cls, rt: Runtime) -> ProviderLimits:
        settings = rt.settings
        return cls(
            rt.pool,
            settings.rate_limits,
            window_s=settings.rate_limit_window_s,
            fallback_after_s=settings.rate_limit_fallback_after_s,
            max_wait_s=settings.rate_limit_max_wait_s,
            known_name=rt.pricing.known_name,
            resends_after_429=settings.provider_max_retries,
        )

    def budget_for(self, provider: str, model: str) -> Budget | None:
        """The most specific configured limit: `provider:model`, then the model, then the provider."""
        budgets = self.budgets
        return budgets.get(f"{provider}:{model}") or budgets.get(model) or budgets.get(provider)

    def wrap(self, provider: Provider, model: str, *, fallback: bool) -> Provider:
        """`provider` itself when `model` has no limit, else a provider that waits for its turn.
        `fallback`: the step has a next model to try when the turn is too far away."""
        budget = self.budget_for(provider.name, model)
        if budget is None:
            return provider
        bound = min(self.fallback_after_s, self.max_wait_s) if fallback else self.max_wait_s
        label = metrics.model_label(self.known_name(provider.name, model))
        return LimitedProvider(self, provider, budget, bound, label)

    async def reserve(self, budget: Budget, tokens: int, bound_s: float) -> db.Reservation:
        """One statement (two the first time this process meets the bucket)."""
        given_back = self._given_back.pop(budget.key, 0.0)
        args = (budget.capacity, budget.per_s, float(tokens), bound_s, given_back, RECOVER)
        found = await db.reserve(self.pool, budget.key, *args)
        if found is None:
            await db.create(self.pool, budget.key, budget.capacity)
            found = await db.reserve(self.pool, budget.key, *args)
            assert found is not None
        return found

    def answered(self, budget: Budget, reserved: int, used: int) -> None:
        """Correct the estimate from the answer's usage (no I/O: at the next reservation)."""
        self._given_back[budget.key] = self._given_back.get(budget.key, 0.0) + (reserved - used)

    async def refused(self, budget: Budget, exc: ProviderError, tokens: int) -> None:
        """A provider 429: shrink the limits in force and empty the buckets for its retry-after,
        less the refused call (`tokens`), which will be sent again."""
        await db.refused(
            self.pool,
            budget.key,
            factor=SHRINK,
            lowest=LOWEST_SCALE,
            retry_after_s=exc.retry_after_s or 0.0,
            remaining=exc.remaining,
            per_s=budget.per_s,
            tokens=tokens,
        )


class LimitedProvider:
    """A `Provider` whose calls wait for their turn in the shared budget (one per step visit and
    model, so `last_wait_ms` is this caller's last call)."""

    def __init__(
        self, limits: ProviderLimits, inner: Provider, budget: Budget, bound_s: float, label: str
    ) -> None:
        self.name = inner.name
        self.inner = inner
        self.limits = limits
        self.budget = budget
        self.bound_s = bound_s
        self.label = label
        self.last_wait_ms = 0.0

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Wait for a turn, then send; a provider 429 lowers the shared budget and the call is
        sent again at its next turn (up to `STEVORA_PROVIDER_MAX_RETRIES` times, as the SDK
        would have, but through the budget: the SDK's own resending of a 429 is switched off)."""
        tokens = estimate_tokens(request)
        started = time.perf_counter()
        resends = self.limits.resends_after_429
        while True:
            await self._turn(request, tokens, started)
            sending = UNDER_SHARED_LIMIT.set(True)
            try:
                response = await self.inner.complete(request)
            except ProviderError as exc:
                if exc.status_code != 429:
                    raise
                await self.limits.refused(self.budget, exc, tokens)
                if not exc.retryable or resends == 0:
                    raise
                resends -= 1
                continue
            finally:
                UNDER_SHARED_LIMIT.reset(sending)
            usage = response.usage
            self.limits.answered(self.budget, tokens, usage.input_tokens + usage.output_tokens)
            return response

    async def _turn(self, request: LlmRequest, tokens: int, started: float) -> None:
        """Reserve the call's request and tokens and sleep until its turn; a turn beyond the
        bound is not taken: RATE_LIMITED, not sent."""
        turn = await self.limits.reserve(self.budget, tokens, self.bound_s)
        if not turn.granted:
            observe.rate_limit_waited(self.name, self.label, 0.0, "refused")
            raise ProviderError(
                f"{self.name}: the rate limit of {self.budget.key} has no turn for {request.model} "
                f"within {self.bound_s:g} s (next in {turn.wait_s:.1f} s); not sent",
                provider=self.name,
                retryable=True,
                retry_after_s=turn.wait_s,
                code=RATE_LIMITED,
            )
        if turn.wait_s > 0:
            await asyncio.sleep(turn.wait_s)
        waited_s = time.perf_counter() - started
        self.last_wait_ms = round(waited_s * 1000, 3)
        observe.rate_limit_waited(self.name, self.label, waited_s, "sent")

    async def aclose(self) -> None:
        """The router closes the inner provider; a wrapper owns nothing."""


@dataclass(frozen=True)
class LimitUse:
    """One configured limit's current use, as the UI shows it."""

    key: str
    window_s: float
    requests: tuple[float, int] | None  # (in use now, the limit per window); None: not limited
    tokens: tuple[float, int] | None
    in_force: float  # the share of the limits a provider 429 left in force (1.0: all)


async def current_use(pool: asyncpg.Pool, settings: Settings) -> list[LimitUse]:
    """Every configured limit's use: what its shared buckets hold reserved now (beyond the limit
    when calls are waiting for their turn). One statement."""
    window_s = settings.rate_limit_window_s
    stored = {b.key: b for b in await db.snapshot(pool, list(settings.rate_limits))}
    out = []
    for key, limit in settings.rate_limits.items():
        budget = Budget.of(key, limit, window_s)
        bucket = stored.get(key)
        scale = bucket.scale if bucket is not None else 1.0
        used: list[tuple[float, int] | None] = []
        for i, configured in enumerate((limit.rpm, limit.tpm)):
            if configured is None:
                used.append(None)
                continue
            if bucket is None:
                used.append((0.0, configured))
                continue
            level = (bucket.requests, bucket.tokens)[i] + bucket.age_s * budget.per_s[i] * scale
            used.append(
                (max(0.0, budget.capacity[i] * scale - min(budget.capacity[i] * scale, level)), configured)
            )
        out.append(LimitUse(key, window_s, used[0], used[1], scale))
    return out
