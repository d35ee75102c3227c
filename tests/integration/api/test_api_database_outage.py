"""While PostgreSQL is down or restarting the API answers 503 with Retry-After (never 500), and it
recovers by itself: no dead pooled connection is handed to a request afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from api_helpers import Tenant, bootstrap_tenant, make_client
from tcp_proxy import TcpProxy, proxy_for_database, through_proxy

from stevora.api import create_app
from stevora.db.database import asyncpg_dsn
from stevora.engine.dispatch import RecordingDispatcher
from stevora.ids import new_id
from stevora.llm.router import ProviderRouter
from stevora.runtime import Runtime
from stevora.settings import Settings

TASK = [{"type": "task", "name": "t", "handler": "h"}]


async def _terminate_backends(database_url: str) -> int:
    """`pg_terminate_backend` for every other session of the test database."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        killed: int = await conn.fetchval(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        # pg_terminate_backend only signals; wait until those sessions are gone, as after a restart.
        for _ in range(200):
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            if others == 0:
                break
            await asyncio.sleep(0.01)
    finally:
        await conn.close()
    await asyncio.sleep(0.05)  # the sockets' EOF reaches this event loop
    return killed


async def _exercise(client: httpx.AsyncClient, tenant: Tenant, definition_id: str) -> list[httpx.Response]:
    """One of each kind of request: auth lookup, list, get, create (engine pool), health."""
    h = tenant.headers
    created = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=h)
    responses = [
        created,
        await client.get("/v1/workflow-definitions", headers=h),
        await client.get(f"/v1/workflow-definitions/{definition_id}", headers=h),
        await client.get("/v1/workflow-runs", headers=h),
        await client.get("/v1/workspaces/current", headers=h),
    ]
    if created.status_code == 201:
        responses.append(await client.get(f"/v1/workflow-runs/{created.json()['data']['id']}", headers=h))
    return responses


async def _another_key(client: httpx.AsyncClient, tenant: Tenant) -> Tenant:
    response = await client.post("/v1/api-keys", json={"name": "more"}, headers=tenant.headers)
    assert response.status_code == 201, response.text
    data = response.json()["data"]
    return Tenant(tenant.workspace_id, data["key"], data["id"])


async def _define(client: httpx.AsyncClient, tenant: Tenant) -> str:
    body = {"name": new_id("wf"), "version": "1", "steps": TASK}
    response = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.text
    definition_id: str = response.json()["data"]["id"]
    return definition_id


async def test_first_requests_after_the_database_dropped_every_connection_succeed(
    harness: Any, settings: Settings, database_url: str
) -> None:
    async with make_client(create_app(settings, runtime=harness.rt)) as client:
        tenant = await bootstrap_tenant(client)
        definition_id = await _define(client, tenant)
        for _ in range(3):
            assert all(r.status_code < 300 for r in await _exercise(client, tenant, definition_id))
            assert await _terminate_backends(database_url) >= 1
            # The authenticator's cache would hide the auth query: a fresh key is looked up.
            tenant = await _another_key(client, tenant)
            responses = await _exercise(client, tenant, definition_id)
            assert [r.status_code for r in responses] == [201, 200, 200, 200, 200, 200], [
                r.text for r in responses if r.status_code >= 300
            ]


@pytest.fixture
async def proxied(settings: Settings) -> AsyncIterator[tuple[TcpProxy, Runtime]]:
    """A Runtime whose connections to PostgreSQL all go through a proxy the test can stop, to the
    server the suite uses: the machine's (TCP) or its embedded one (a Unix socket)."""
    proxy = proxy_for_database(settings.database_url)
    await proxy.start()
    rt = await Runtime.start(
        settings.model_copy(update={"database_url": through_proxy(settings.database_url, proxy)}),
        dispatcher=RecordingDispatcher(),
        providers=ProviderRouter({}),
    )
    try:
        yield proxy, rt
    finally:
        await proxy.stop()
        await rt.close()


async def test_api_answers_503_with_retry_after_while_the_database_is_down_then_recovers(
    proxied: tuple[TcpProxy, Runtime], settings: Settings
) -> None:
    proxy, rt = proxied
    async with make_client(create_app(settings, runtime=rt)) as client:
        tenant = await bootstrap_tenant(client)
        definition_id = await _define(client, tenant)
        assert all(r.status_code < 300 for r in await _exercise(client, tenant, definition_id))

        await proxy.stop()  # PostgreSQL "crashed": open connections cut, new ones refused
        fresh_key = {"x-api-key": "stv_" + "a" * 32}  # not cached: needs the database
        for _ in range(2):
            responses = [
                *await _exercise(client, tenant, definition_id),
                await client.get("/v1/workflow-runs", headers=fresh_key),
                await client.post(
                    "/v1/workspaces", json={"name": "x", "slug": new_id("s").replace("_", "-")}
                ),
            ]
            for response in responses:
                if response.status_code < 300:
                    continue  # served from a cache (definitions, keys): fine
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "1"
                assert response.json()["error"]["code"] == "SERVICE_UNAVAILABLE"
            assert any(r.status_code == 503 for r in responses)

        await proxy.start()  # back on the same port: the API recovers without a restart
        responses = await _exercise(client, tenant, definition_id)
        assert [r.status_code for r in responses] == [201, 200, 200, 200, 200, 200], [
            r.text for r in responses
        ]
