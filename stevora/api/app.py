"""The FastAPI application factory.

`create_app(settings)` owns its Runtime: the lifespan starts one (the asyncpg pool, the
Dramatiq dispatcher for `settings.broker_url`) and closes it on shutdown.
`create_app(settings, runtime=rt)` uses the caller's Runtime and never closes it (tests, the
embedded `stevora dev` process).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Receive, Scope, Send

from stevora.api.auth import ApiKeyAuthenticator
from stevora.api.deps import ApiContext
from stevora.api.errors import install_error_handlers
from stevora.api.limits import EdgeLimits
from stevora.api.openapi import install_openapi
from stevora.api.routers import (
    api_keys,
    approvals,
    bulk,
    costs,
    definitions,
    events,
    forks,
    health,
    hooks,
    mcp_servers,
    provider_limits,
    runs,
    schedules,
    store,
    threads,
    traces,
    trigger_events,
    webhooks,
    workspaces,
)
from stevora.engine.brokers import build_broker
from stevora.engine.dispatch import DramatiqDispatcher
from stevora.observability import metrics, tracing
from stevora.request_checks import reject_nul
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.throttle.failed_auth import FailedAuthLimiter
from stevora.throttle.workspace_requests import RateLimiter
from stevora.tuning import tune_gc
from stevora.ui import build_ui_router, mount_static

DESCRIPTION = """Durable workflow orchestration with traced LLM tool-calling steps.

Authenticate with `x-api-key: stv_...` (every route except health and workspace creation).
Responses are `{"success": true, "data": ...}` (lists with pages add `meta`); errors are
`{"success": false, "error": {"code", "message", "details"}}`."""


def build_v1_router() -> APIRouter:
    v1 = APIRouter(dependencies=[Depends(reject_nul)])
    for module in (
        workspaces,
        api_keys,
        definitions,
        runs,
        forks,
        bulk,
        events,
        traces,
        approvals,
        webhooks,
        provider_limits,
        schedules,
        trigger_events,
        hooks,
        mcp_servers,
        threads,
        store,
    ):
        v1.include_router(module.router)
    v1.include_router(threads.runs_router)
    v1.include_router(costs.runs_router)
    v1.include_router(costs.router)
    v1.include_router(health.router)
    return v1


class ApiPrefixAlias:
    """Serve `/api/v1/...` (the prefix some reference pages use) as `/v1/...`.

    A path rewrite instead of mounting every route twice, which doubled route matching."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"].startswith("/api/v1/"):
            scope = {**scope, "path": scope["path"][4:], "raw_path": scope.get("raw_path", b"")[4:] or None}
            if scope["raw_path"] is None:
                del scope["raw_path"]
        await self.app(scope, receive, send)


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    ctx = ApiContext(
        settings=settings,
        keys=ApiKeyAuthenticator(failures=FailedAuthLimiter(settings.auth_failures_per_minute)),
        limiter=RateLimiter(settings.rate_limit_per_minute),
        runtime=runtime,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tracing.configure_tracing(settings)
        if runtime is not None:
            tune_gc()
            yield
            return
        dispatcher = DramatiqDispatcher(build_broker(settings.broker_url), settings.queue_name)
        ctx.runtime = await Runtime.start(settings, dispatcher=dispatcher)
        tune_gc()
        try:
            yield
        finally:
            rt, ctx.runtime = ctx.runtime, None
            await rt.close()

    # Swagger UI (/docs) and ReDoc (/redoc) with their JS/CSS served from the fastapi-offline
    # package, so the docs work without a CDN (air-gapped hosts, strict networks).
    app = FastAPIOffline(
        title="Stevora API",
        version="1.0.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url="/redoc",
        static_url="/docs-static",
    )
    app.state.ctx = ctx
    install_error_handlers(app)
    # Outside the catch-all: an oversize or hostile body is refused before any route reads it.
    app.add_middleware(EdgeLimits, settings=settings)
    app.add_middleware(ApiPrefixAlias)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )
    v1 = build_v1_router()
    app.include_router(v1, prefix="/v1")
    app.include_router(health.router, dependencies=[Depends(reject_nul)])
    app.include_router(hooks.inbound_router)  # third parties' webhooks: signed, no API key
    # The web UI authenticates with its own cookie; see docs/ui.md.
    app.include_router(build_ui_router())
    mount_static(app)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui")

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        if not metrics.authorized(settings.metrics_token, request.headers.get("authorization")):
            return PlainTextResponse(
                "Unauthorized: send Authorization: Bearer <STEVORA_METRICS_TOKEN>\n",
                status_code=401,
                headers=metrics.UNAUTHORIZED_HEADERS,
            )
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    install_openapi(app)
    return app
