"""Fixtures for tests that run real worker processes against a real broker."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from stevora.engine.brokers import build_broker
from stevora.engine.dispatch import DramatiqDispatcher
from stevora.ids import new_id
from stevora.runtime import Runtime
from stevora.settings import Settings

BROKERS = {
    "rabbitmq": ("amqp://guest:guest@127.0.0.1:5672/", 5672),
    "redis": ("redis://127.0.0.1:6379/0", 6379),
}


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def require_broker(name: str) -> str:
    url, port = BROKERS[name]
    if not _reachable(port):
        message = f"{name} is not reachable on 127.0.0.1:{port}"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI requires it (.ci/run starts it)")
        pytest.skip(f"SKIPPED LOUDLY: {message}; start it to run broker tests")
    return url


@dataclass
class BrokerSetup:
    name: str
    url: str
    queue: str
    rt: Runtime  # dispatches to the real broker; never executes runs itself
    workspace_id: str


@pytest.fixture(params=["rabbitmq", "redis"])
async def broker_setup(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[BrokerSetup]:
    url = require_broker(request.param)
    queue = f"test-{secrets.token_hex(4)}"
    client_settings = settings.model_copy(update={"broker_url": url, "queue_name": queue})
    broker = build_broker(url)
    rt = await Runtime.start(client_settings, dispatcher=DramatiqDispatcher(broker, queue))
    ws = new_id("ws")
    await rt.pool.execute(
        "INSERT INTO workspaces (id, name, slug) VALUES ($1, 'e2e', $2)", ws, ws.replace("_", "-")
    )
    await rt.pool.execute(
        "CREATE TABLE IF NOT EXISTS test_side_effects (idempotency_key text PRIMARY KEY, executions int NOT NULL)"
    )
    try:
        yield BrokerSetup(request.param, url, queue, rt, ws)
    finally:
        await rt.close()
        broker.close()
