"""Client test fixtures: the API app on the harness Runtime and an API key for the test workspace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from stevora.api.app import create_app
from stevora.client import AsyncAgentRuntime
from stevora.settings import Settings
from tests.integration.client.live_server import insert_api_key, serve


@pytest.fixture
def app(harness: Any, settings: Settings) -> FastAPI:
    return create_app(settings, runtime=harness.rt)


@pytest.fixture
async def api_key(harness: Any, workspace_id: str) -> str:
    return await insert_api_key(harness.rt, workspace_id)


@pytest.fixture
async def client(app: FastAPI, api_key: str) -> AsyncIterator[AsyncAgentRuntime]:
    """The async client, talking to the app in-process."""
    transport = httpx.ASGITransport(app=app)
    async with AsyncAgentRuntime(api_key, base_url="http://stevora.test", transport=transport) as rt:
        yield rt


@pytest.fixture
async def server_url(app: FastAPI) -> AsyncIterator[str]:
    """The app behind a real uvicorn server on 127.0.0.1."""
    async with serve(app) as url:
        yield url
