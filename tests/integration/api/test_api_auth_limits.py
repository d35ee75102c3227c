"""Abuse limits at the edge (issue 18): failed authentication is limited per client address before
it costs a lookup (API keys, admin tokens, the UI's cookie and login form), and the UI spends the
same per-workspace rate limit as the API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from api_helpers import Tenant, bootstrap_tenant
from fastapi import FastAPI

from stevora.api import create_app
from stevora.ids import random_token
from stevora.settings import Settings
from stevora.ui import auth as ui_auth

LIMIT = 5


def _client(app: FastAPI, address: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def _guess() -> dict[str, str]:
    return {"x-api-key": "stv_" + random_token(32)}


def _cookie(key: str) -> dict[str, str]:
    return {"cookie": f"{ui_auth.COOKIE_NAME}={key}"}


class LookupCounter:
    """Counts the key lookups that reach the database (API keys and the UI's key query)."""

    def __init__(self, app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
        self.api = 0
        self.ui = 0
        keys = app.state.ctx.keys
        api_lookup, ui_lookup = keys._lookup, ui_auth.user_for_key

        async def counted_api(*args: Any) -> Any:
            self.api += 1
            return await api_lookup(*args)

        async def counted_ui(*args: Any) -> Any:
            self.ui += 1
            return await ui_lookup(*args)

        monkeypatch.setattr(keys, "_lookup", counted_api)
        monkeypatch.setattr(ui_auth, "user_for_key", counted_ui)


@pytest.fixture
def app(harness: Any, settings: Settings) -> FastAPI:
    return create_app(settings.model_copy(update={"auth_failures_per_minute": LIMIT}), runtime=harness.rt)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(app) as c:
        yield c


def _assert_throttled(response: httpx.Response, message: str = "Too many failed authentication") -> None:
    assert response.status_code == 429, response.text
    assert 1 <= int(response.headers["Retry-After"]) <= 60
    assert message in response.text


async def test_after_n_failed_keys_an_address_gets_429_without_a_lookup(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = LookupCounter(app, monkeypatch)
    codes = [(await client.get("/v1/workflow-runs", headers=_guess())).status_code for _ in range(LIMIT)]
    assert codes == [401] * LIMIT and lookups.api == LIMIT
    for headers in (_guess(), {"x-api-key": "not-even-a-key"}, tenant.headers):
        refused = await client.get("/v1/workflow-runs", headers=headers)
        _assert_throttled(refused)
        assert refused.json()["error"]["code"] == "RATE_LIMIT_ERROR"
    assert lookups.api == LIMIT  # nothing more reached the database
    # Another address is not affected; a request without a key is no attempt at all.
    async with _client(app, "203.0.113.9") as elsewhere:
        assert (await elsewhere.get("/v1/workflow-runs", headers=tenant.headers)).status_code == 200
    missing = await client.get("/v1/workflow-runs")
    assert missing.status_code == 401 and missing.json()["error"]["message"] == "Missing x-api-key header"


async def test_concurrent_guesses_cost_at_most_the_limit_in_lookups(
    app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = LookupCounter(app, monkeypatch)
    responses = await asyncio.gather(*(client.get("/v1/workflow-runs", headers=_guess()) for _ in range(40)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [401] * LIMIT + [429] * (40 - LIMIT)
    assert lookups.api == LIMIT


async def test_a_good_key_never_spends_the_address_attempts(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.state.ctx.keys.ttl_s = 0.0  # every request looks its key up
    lookups = LookupCounter(app, monkeypatch)
    for _ in range(3 * LIMIT):
        assert (await client.get("/v1/workflow-runs", headers=tenant.headers)).status_code == 200
    together = await asyncio.gather(
        *(client.get("/v1/workflow-runs", headers=tenant.headers) for _ in range(30))
    )
    assert {r.status_code for r in together} == {200}
    assert lookups.api >= 3 * LIMIT
    # ... and the address still has all its attempts for mistakes.
    codes = [(await client.get("/v1/workflow-runs", headers=_guess())).status_code for _ in range(LIMIT)]
    assert codes == [401] * LIMIT


async def test_wrong_admin_tokens_count_as_failed_attempts(harness: Any, settings: Settings) -> None:
    guarded = settings.model_copy(update={"auth_failures_per_minute": LIMIT, "admin_token": "adm1n-t0ken"})
    async with _client(create_app(guarded, runtime=harness.rt)) as client:
        for _ in range(LIMIT):
            response = await client.post(
                "/v1/workspaces",
                json={"name": "x", "slug": random_token(8)},
                headers={"x-admin-token": "guess"},
            )
            assert response.status_code == 401
        refused = await client.post(
            "/v1/workspaces",
            json={"name": "x", "slug": random_token(8)},
            headers={"x-admin-token": "adm1n-t0ken"},
        )
        _assert_throttled(refused)
        key = await client.post(
            "/v1/api-keys",
            json={"name": "k", "workspaceId": "ws_x"},
            headers={"x-admin-token": "adm1n-t0ken"},
        )
        _assert_throttled(key)


async def test_ui_cookies_and_logins_with_bad_keys_are_limited_per_address(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = LookupCounter(app, monkeypatch)
    for _ in range(LIMIT - 1):
        page = await client.get("/ui/runs", headers=_cookie("stv_" + random_token(32)))
        assert page.status_code == 303 and page.headers["location"].startswith("/ui/login")
        # The dead key's cookie is dropped, so an open tab stops spending the address's attempts.
        assert f'{ui_auth.COOKIE_NAME}="";' in page.headers["set-cookie"]
    login = await client.post("/ui/login", data={"key": "stv_" + random_token(32), "next": "/ui/runs"})
    assert login.status_code == 401
    assert lookups.ui == LIMIT

    _assert_throttled(await client.get("/ui/runs", headers=_cookie("stv_" + random_token(32))))
    _assert_throttled(await client.get("/ui/runs", headers=_cookie(tenant.key)))
    refused_login = await client.post("/ui/login", data={"key": tenant.key, "next": "/ui/runs"})
    _assert_throttled(refused_login)
    assert "<form" in refused_login.text  # the login page, saying why
    assert lookups.ui == LIMIT
    # The API shares the count: this address's keys are refused there too.
    _assert_throttled(await client.get("/v1/workflow-runs", headers=tenant.headers))


async def test_the_ui_shares_the_workspace_rate_limit_with_the_api(harness: Any, settings: Settings) -> None:
    limited = settings.model_copy(update={"rate_limit_per_minute": 3})
    async with _client(create_app(limited, runtime=harness.rt)) as client:
        tenant = await bootstrap_tenant(client)  # the key creation takes one token
        assert (await client.get("/v1/workflow-runs", headers=tenant.headers)).status_code == 200
        assert (await client.get("/ui/runs", headers=_cookie(tenant.key))).status_code == 200
        assert (await client.get("/v1/workflow-runs", headers=tenant.headers)).status_code == 429
        # After the API throttled the key, the UI does too.
        page = await client.get("/ui/runs", headers=_cookie(tenant.key))
        _assert_throttled(page, "Too many requests")
        assert (await client.get("/ui/approvals", headers=_cookie(tenant.key))).status_code == 429

        other = await bootstrap_tenant(client)  # another workspace: its own bucket
        for _ in range(2):
            assert (await client.get("/ui/approvals", headers=_cookie(other.key))).status_code == 200
        assert (await client.get("/v1/workflow-runs", headers=other.headers)).status_code == 429
