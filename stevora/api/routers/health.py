"""`GET /health` (and `/v1/health`): no auth. 200 `{status: "ok", checks}` in the success
envelope; 503 in the error envelope (`SERVICE_UNAVAILABLE`, `details = {status: "degraded",
checks}`) when a check fails. Results are cached for 2 s, since the route is unauthenticated
and the queue check opens a broker connection."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any, Literal

import structlog
from fastapi import APIRouter
from starlette.responses import Response

from stevora.api.deps import ApiContext, CachedHealth, Ctx
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import ApiOut, Envelope, error_response, ok
from stevora.db.database import ping
from stevora.engine.dispatch import DramatiqDispatcher
from stevora.runtime import Runtime

log = structlog.get_logger("stevora.api")
router = APIRouter(tags=["health"])
CHECK_TIMEOUT_S = 3.0
CACHE_S = 2.0


class HealthOut(ApiOut):
    status: Literal["ok", "degraded"]
    checks: dict[str, str]


async def _database(rt: Runtime) -> None:
    await ping(rt.pool)


def _broker_ping(broker: Any) -> None:
    """Blocking: reach the broker itself (a fresh connection, so a stale pooled one can't lie)."""
    name = type(broker).__name__
    if name == "RabbitmqBroker":
        import pika

        configured = broker.parameters[0] if isinstance(broker.parameters, list) else broker.parameters
        params = copy.copy(configured)  # same host and credentials, shorter timeouts
        params.socket_timeout = CHECK_TIMEOUT_S
        params.stack_timeout = CHECK_TIMEOUT_S
        params.connection_attempts = 1
        connection = pika.BlockingConnection(params)
        try:
            connection.channel().close()
        finally:
            connection.close()
    elif name == "RedisBroker":
        broker.client.ping()
    # StubBroker and other in-process brokers are always reachable.


async def _queue(rt: Runtime) -> None:
    dispatcher = rt.dispatcher
    if isinstance(dispatcher, DramatiqDispatcher):
        await asyncio.to_thread(_broker_ping, dispatcher.broker)
    # Inline and recording dispatchers run in this process: nothing to reach.


async def _check(name: str, probe: Any) -> str:
    try:
        await asyncio.wait_for(probe, CHECK_TIMEOUT_S)
        return "ok"
    except Exception as exc:
        log.warning("health_check_failed", check=name, error=repr(exc))
        return "error"


async def health_of(ctx: ApiContext) -> HealthOut:
    cached = ctx.health
    if isinstance(cached.answer, HealthOut) and cached.until > time.monotonic():
        return cached.answer
    rt = ctx.runtime
    if rt is None:
        checks = {"database": "error", "queue": "error"}
    else:
        database, queue = await asyncio.gather(_check("database", _database(rt)), _check("queue", _queue(rt)))
        checks = {"database": database, "queue": queue}
    status: Literal["ok", "degraded"] = "ok" if all(v == "ok" for v in checks.values()) else "degraded"
    result = HealthOut(status=status, checks=checks)
    ctx.health = CachedHealth(result, time.monotonic() + CACHE_S)
    return result


@router.get("/health", response_model=Envelope[HealthOut], responses=errors(503), summary="Health check")
async def health(ctx: Ctx) -> Response:
    result = await health_of(ctx)
    if result.status == "ok":
        return ok(result)
    details = result.model_dump(by_alias=True)
    failed = ", ".join(k for k, v in result.checks.items() if v != "ok")
    return error_response(503, "SERVICE_UNAVAILABLE", f"Service degraded: {failed}", details)
