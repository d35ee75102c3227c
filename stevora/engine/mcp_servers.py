"""A worker's MCP servers as the rest of the system sees them (docs/mcp.md): each worker publishes
its own servers (`mcp_worker_servers`) at start and then every `PUBLISH_EVERY_S`, with their
health, so the API can tell a definition naming an unknown server (400) and `stevora mcp list`
and the UI can show them; a clean shutdown takes them off the list."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog

from stevora.db import mcp as db_mcp

if TYPE_CHECKING:
    from stevora.runtime import Runtime

PUBLISH_EVERY_S = 10.0
log = structlog.get_logger("stevora.mcp")


async def publish(rt: Runtime, worker_id: str) -> None:
    health = rt.mcp.health()
    await db_mcp.publish_worker_servers(
        rt.pool,
        worker_id,
        [
            (name, rt.mcp.servers[name].transport, h.state, h.restarts, h.last_error, h.server_version)
            for name, h in health.items()
        ],
    )


async def publish_forever(rt: Runtime, worker_id: str) -> None:
    """Publish now and then periodically; a failed publish is retried at the next tick."""
    if not rt.mcp.servers:
        return
    while True:
        try:
            await publish(rt, worker_id)
        except Exception as exc:
            log.warning("mcp_servers_not_published", error=str(exc))
        await asyncio.sleep(PUBLISH_EVERY_S)


async def withdraw(rt: Runtime, worker_id: str, publisher: asyncio.Task[None] | None) -> None:
    if publisher is not None:
        publisher.cancel()
        with contextlib.suppress(BaseException):
            await publisher
    if rt.mcp.servers:
        with contextlib.suppress(Exception):
            await db_mcp.forget_worker(rt.pool, worker_id)
