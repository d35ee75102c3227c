"""API test fixtures: the app on the harness Runtime, driven in-process through httpx.

`httpx.ASGITransport` does not run the lifespan, which is what we want: the app uses the
harness's Runtime (runs execute in-process) instead of starting its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from api_helpers import Conforms, DefinitionFactory, Tenant, bootstrap_tenant, check_conformance, make_client
from fastapi import FastAPI

from stevora.api import create_app
from stevora.ids import new_id
from stevora.settings import Settings


@pytest.fixture
def app(harness: Any, settings: Settings) -> FastAPI:
    return create_app(settings, runtime=harness.rt)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(app) as c:
        yield c


@pytest.fixture
async def tenant(client: httpx.AsyncClient) -> Tenant:
    return await bootstrap_tenant(client)


@pytest.fixture
async def other_tenant(client: httpx.AsyncClient) -> Tenant:
    return await bootstrap_tenant(client)


@pytest.fixture
def define(client: httpx.AsyncClient, tenant: Tenant) -> DefinitionFactory:
    """POST a definition for `tenant` (or `as_=` another) and return its id."""

    async def make(steps: list[dict[str, Any]], *, name: str | None = None, as_: Tenant | None = None) -> str:
        body = {"name": name or new_id("wf"), "version": "1.0.0", "steps": steps}
        response = await client.post("/v1/workflow-definitions", json=body, headers=(as_ or tenant).headers)
        assert response.status_code == 201, response.text
        definition_id: str = response.json()["data"]["id"]
        return definition_id

    return make


@pytest.fixture
def conforms(app: FastAPI) -> Conforms:
    document = app.openapi()

    def check(response: httpx.Response, method: str, path: str) -> None:
        check_conformance(document, response, method, path)

    return check
