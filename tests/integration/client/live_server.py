"""Helpers for the client and CLI tests: an API key for a test workspace, and the API served by a
real uvicorn on 127.0.0.1 (a task on the test's event loop, which is where the harness Runtime
lives; blocking clients are called from `asyncio.to_thread`)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from stevora.ids import new_id, random_token
from stevora.runtime import Runtime


async def insert_api_key(rt: Runtime, workspace_id: str) -> str:
    """A working raw `stv_...` key for the workspace (stored the way the API stores keys)."""
    raw = "stv_" + random_token(32)
    await rt.pool.execute(
        "INSERT INTO api_keys (id, workspace_id, name, key_hash, key_prefix) VALUES ($1, $2, $3, $4, $5)",
        new_id("key"),
        workspace_id,
        "test",
        hashlib.sha256(raw.encode()).hexdigest(),
        raw[:8],
    )
    return raw


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    """Serve `app` on a free local port for the duration; yields its base URL."""
    # A bounded graceful shutdown: an open event stream must not keep the test from ending.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        lifespan="off",
        ws="none",
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # startup failed: raise its error
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
