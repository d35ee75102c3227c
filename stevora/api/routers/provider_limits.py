"""`GET /v1/rate-limits`: each configured provider rate limit and its current use, as the runs
page's "Provider rate limits" panel shows it (docs/flow-control.md).

The limits belong to the deployment (`STEVORA_RATE_LIMITS`) and are shared by every workspace, so
any API key may read them; an empty list when none is configured (and nothing is read)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import Field
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx
from stevora.api.schemas.envelope import ApiOut, Envelope, ok
from stevora.engine import provider_limits

router = APIRouter(prefix="/rate-limits", tags=["flow control"])


class LimitUseOut(ApiOut):
    used: float = Field(description="Reserved in the current window (beyond the limit when calls wait).")
    limit: int = Field(description="The configured limit per window.")


class RateLimitOut(ApiOut):
    key: str = Field(description="As configured: `provider:model`, a model, or a provider.")
    window_s: float = Field(description="STEVORA_RATE_LIMIT_WINDOW_S.")
    requests: LimitUseOut | None = Field(description="Requests per window; null when not limited.")
    tokens: LimitUseOut | None = Field(description="Tokens per window; null when not limited.")
    in_force: float = Field(description="The share of the limits a provider 429 left in force (1.0: all).")


def _use(pair: tuple[float, int] | None) -> LimitUseOut | None:
    return None if pair is None else LimitUseOut(used=round(pair[0], 1), limit=pair[1])


@router.get(
    "",
    response_model=Envelope[list[RateLimitOut]],
    summary="Provider rate limits and their current use",
)
async def rate_limits(auth: Auth, ctx: Ctx) -> Response:
    settings = ctx.rt.settings
    uses = await provider_limits.current_use(ctx.rt.pool, settings) if settings.rate_limits else []
    return ok(
        [
            RateLimitOut(
                key=u.key,
                window_s=u.window_s,
                requests=_use(u.requests),
                tokens=_use(u.tokens),
                in_force=round(u.in_force, 3),
            )
            for u in uses
        ]
    )
