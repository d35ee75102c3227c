"""Request-scoped dependencies: the app context, the caller's workspace, paging, input guards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import APIKeyHeader

from stevora.api.auth import ApiKeyAuthenticator, Principal
from stevora.api.schemas.envelope import ApiOut
from stevora.errors import StevoraError
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.throttle.failed_auth import client_address
from stevora.throttle.workspace_requests import RateLimiter

api_key_header = APIKeyHeader(
    name="x-api-key",
    scheme_name="ApiKeyAuth",
    description="A workspace API key, `stv_` + 32 characters.",
    auto_error=False,
)
admin_token_header = APIKeyHeader(
    name="x-admin-token",
    scheme_name="AdminToken",
    description="The server's ADMIN_TOKEN (workspace creation; first API key).",
    auto_error=False,
)


@dataclass
class CachedHealth:
    """The last `/health` answer and until when it is served again (`time.monotonic()`)."""

    answer: ApiOut | None = None
    until: float = 0.0


@dataclass
class ApiContext:
    """What the routers share, kept on `app.state.ctx` (no module globals)."""

    settings: Settings
    keys: ApiKeyAuthenticator
    limiter: RateLimiter
    runtime: Runtime | None = None
    sse_poll_s: float = 0.3
    sse_keepalive_s: float = 15.0
    health: CachedHealth = field(default_factory=lambda: CachedHealth())

    @property
    def rt(self) -> Runtime:
        if self.runtime is None:
            raise StevoraError("Runtime is not started", http_status=503, code="SERVICE_UNAVAILABLE")
        return self.runtime


# Dependencies are `async def` on purpose: FastAPI runs plain `def` dependencies in a thread
# pool, which costs a thread hop per dependency per request.
async def get_ctx(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ApiContext, Depends(get_ctx)]


async def authenticated(
    request: Request, ctx: Ctx, api_key: Annotated[str | None, Depends(api_key_header)]
) -> Principal:
    """The caller's workspace from `x-api-key`, after the workspace's rate limit (and the client
    address's limit on failed attempts)."""
    principal = await ctx.keys.authenticate(ctx.rt, api_key, client_address(request))
    await ctx.limiter.hit(ctx.rt, principal.workspace_id)
    return principal


Auth = Annotated[Principal, Depends(authenticated)]


_MAX_OFFSET = 2**63 - 1


@dataclass(frozen=True, slots=True)
class PageParams:
    page: int
    page_size: int

    @property
    def offset(self) -> int:
        # Capped to PostgreSQL's bigint: any page that far is past the end (an empty page), and
        # a query given a larger OFFSET would fail to encode it (a 500).
        return min((self.page - 1) * self.page_size, _MAX_OFFSET)


async def page_params(
    page: Annotated[int, Query(ge=1, description="1-based page number.")] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=100, description="Items per page.")] = 20,
) -> PageParams:
    return PageParams(page, page_size)


Paging = Annotated[PageParams, Depends(page_params)]
