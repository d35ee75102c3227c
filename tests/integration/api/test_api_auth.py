"""API keys authenticate requests; ADMIN_TOKEN gates workspace creation; the first-key rules."""

from __future__ import annotations

import asyncio
import hashlib
import re

import httpx
from api_helpers import Tenant, bootstrap_tenant, make_client

from stevora.api import create_app
from stevora.api.auth import KEY_CACHE_TTL_S, ApiKeyAuthenticator
from stevora.settings import Settings

ADMIN = "admin-secret-token"


def _error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert body["success"] is False
    error: dict[str, object] = body["error"]
    return error


async def test_request_without_api_key_is_401_with_the_documented_message(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/workflow-runs")
    assert response.status_code == 401
    assert _error(response) == {"code": "AUTH_ERROR", "message": "Missing x-api-key header", "details": {}}


async def test_unknown_or_malformed_api_key_is_401_invalid(client: httpx.AsyncClient) -> None:
    for key in ("stv_" + "a" * 32, "not-a-stevora-key"):
        response = await client.get("/v1/workflow-runs", headers={"x-api-key": key})
        assert response.status_code == 401
        assert _error(response)["message"] == "Invalid or revoked API key"


async def test_created_key_has_the_documented_format_and_only_its_hash_is_stored(
    client: httpx.AsyncClient, tenant: Tenant, harness: object
) -> None:
    assert re.fullmatch(r"stv_[a-z0-9]{32}", tenant.key)
    row = await harness.rt.pool.fetchrow(
        "SELECT key_hash, key_prefix FROM api_keys WHERE id = $1", tenant.key_id
    )  # type: ignore[attr-defined]
    assert row["key_hash"] == hashlib.sha256(tenant.key.encode()).hexdigest()
    assert row["key_prefix"] == tenant.key[:8]
    listed = (await client.get("/v1/api-keys", headers=tenant.headers)).json()["data"]
    assert tenant.key not in str(listed)


async def test_revoked_key_is_rejected_immediately_in_this_process(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    second = await client.post("/v1/api-keys", json={"name": "second"}, headers=tenant.headers)
    second_key = second.json()["data"]["key"]
    assert (await client.get("/v1/workflow-runs", headers={"x-api-key": second_key})).status_code == 200
    revoked = await client.delete(f"/v1/api-keys/{second.json()['data']['id']}", headers=tenant.headers)
    assert revoked.status_code == 200
    assert revoked.json()["data"]["revokedAt"] is not None
    response = await client.get("/v1/workflow-runs", headers={"x-api-key": second_key})
    assert response.status_code == 401
    assert _error(response)["message"] == "Invalid or revoked API key"


async def test_key_revoked_by_another_process_stops_working_within_the_cache_ttl(
    client: httpx.AsyncClient, tenant: Tenant, harness: object, app: object
) -> None:
    app.state.ctx.keys = ApiKeyAuthenticator(ttl_s=0.2)  # type: ignore[attr-defined]
    assert (await client.get("/v1/workflow-runs", headers=tenant.headers)).status_code == 200
    # Revoked behind this process's back (as another API process would do).
    await harness.rt.pool.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", tenant.key_id)  # type: ignore[attr-defined]
    await asyncio.sleep(0.25)
    assert (await client.get("/v1/workflow-runs", headers=tenant.headers)).status_code == 401


async def test_successful_authentication_sets_last_used_at(client: httpx.AsyncClient, tenant: Tenant) -> None:
    keys = (await client.get("/v1/api-keys", headers=tenant.headers)).json()["data"]
    (mine,) = [k for k in keys if k["id"] == tenant.key_id]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", mine["lastUsedAt"])


async def test_workspace_creation_requires_matching_admin_token_when_configured(
    settings: Settings, harness: object
) -> None:
    app = create_app(settings.model_copy(update={"admin_token": ADMIN}), runtime=harness.rt)  # type: ignore[attr-defined]
    async with make_client(app) as client:
        body = {"name": "Gated", "slug": "gated-" + hashlib.md5(str(id(app)).encode()).hexdigest()[:8]}
        missing = await client.post("/v1/workspaces", json=body)
        assert missing.status_code == 401
        assert _error(missing) == {
            "code": "AUTH_ERROR",
            "message": "Missing x-admin-token header",
            "details": {},
        }
        wrong = await client.post("/v1/workspaces", json=body, headers={"x-admin-token": "nope"})
        assert wrong.status_code == 401
        assert _error(wrong)["message"] == "Invalid admin token"
        created = await client.post("/v1/workspaces", json=body, headers={"x-admin-token": ADMIN})
        assert created.status_code == 201


async def test_admin_token_creates_a_key_in_any_workspace_even_after_the_first(
    settings: Settings, harness: object
) -> None:
    app = create_app(settings.model_copy(update={"admin_token": ADMIN}), runtime=harness.rt)  # type: ignore[attr-defined]
    async with make_client(app) as client:
        tenant = await bootstrap_tenant(client, **{"x-admin-token": ADMIN})
        again = await client.post(
            "/v1/api-keys",
            json={"name": "ops", "workspaceId": tenant.workspace_id},
            headers={"x-admin-token": ADMIN},
        )
        assert again.status_code == 201
        assert again.json()["data"]["workspaceId"] == tenant.workspace_id
        # With ADMIN_TOKEN configured there is no bootstrap without it.
        fresh = await client.post(
            "/v1/workspaces",
            json={"name": "X", "slug": tenant.workspace_id.replace("_", "-") + "-x"},
            headers={"x-admin-token": ADMIN},
        )
        fresh_id = fresh.json()["data"]["id"]
        denied = await client.post("/v1/api-keys", json={"name": "first", "workspaceId": fresh_id})
        assert denied.status_code == 401
        bad_token = await client.post(
            "/v1/api-keys", json={"name": "first", "workspaceId": fresh_id}, headers={"x-admin-token": "nope"}
        )
        assert bad_token.status_code == 401
        assert _error(bad_token)["message"] == "Invalid admin token"


async def test_first_key_bootstrap_is_refused_once_the_workspace_has_a_key(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await client.post("/v1/api-keys", json={"name": "sneaky", "workspaceId": tenant.workspace_id})
    assert response.status_code == 401
    assert _error(response)["message"] == "Missing x-api-key header"


async def test_bootstrap_stays_closed_after_every_key_is_revoked(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    await client.delete(f"/v1/api-keys/{tenant.key_id}", headers=tenant.headers)
    response = await client.post("/v1/api-keys", json={"name": "again", "workspaceId": tenant.workspace_id})
    assert response.status_code == 401


async def test_concurrent_bootstrap_requests_create_exactly_one_first_key(client: httpx.AsyncClient) -> None:
    ws = await client.post("/v1/workspaces", json={"name": "Race", "slug": f"race-{id(client)}"})
    workspace_id = ws.json()["data"]["id"]
    responses = await asyncio.gather(
        *(client.post("/v1/api-keys", json={"name": f"k{i}", "workspaceId": workspace_id}) for i in range(10))
    )
    assert sorted(r.status_code for r in responses) == [201] + [401] * 9


async def test_bootstrap_needs_a_workspace_id_that_exists(client: httpx.AsyncClient) -> None:
    missing = await client.post("/v1/api-keys", json={"name": "first"})
    assert missing.status_code == 400
    assert _error(missing)["details"] == {
        "errors": [{"path": "workspaceId", "message": "workspaceId is required without an x-api-key header"}]
    }
    unknown = await client.post("/v1/api-keys", json={"name": "first", "workspaceId": "ws_nope"})
    assert unknown.status_code == 404


async def test_key_holder_cannot_create_keys_in_another_workspace(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    response = await client.post(
        "/v1/api-keys", json={"name": "x", "workspaceId": other_tenant.workspace_id}, headers=tenant.headers
    )
    assert response.status_code == 404


async def test_rate_limit_answers_429_with_retry_after_per_workspace(
    settings: Settings, harness: object
) -> None:
    app = create_app(settings.model_copy(update={"rate_limit_per_minute": 3}), runtime=harness.rt)  # type: ignore[attr-defined]
    async with make_client(app) as client:
        tenant = await bootstrap_tenant(client)  # the bootstrap key creation takes one token
        other = await bootstrap_tenant(client)
        codes = [
            (await client.get("/v1/workflow-runs", headers=tenant.headers)).status_code for _ in range(3)
        ]
        assert codes == [200, 200, 429]
        limited = await client.get("/v1/workflow-runs", headers=tenant.headers)
        assert limited.status_code == 429
        assert _error(limited)["code"] == "RATE_LIMIT_ERROR"
        assert _error(limited)["message"] == "Too many requests"
        retry_after = int(limited.headers["Retry-After"])
        assert 1 <= retry_after <= 20
        # Another workspace has its own bucket.
        assert (await client.get("/v1/workflow-runs", headers=other.headers)).status_code == 200


async def test_rate_limit_holds_across_api_processes(settings: Settings, harness: object) -> None:
    """Two apps = two API processes (own limiters and key caches), one database: one shared limit."""
    limited = settings.model_copy(update={"rate_limit_per_minute": 6})
    first, second = (create_app(limited, runtime=harness.rt) for _ in range(2))  # type: ignore[attr-defined]
    async with make_client(first) as a, make_client(second) as b:
        tenant = await bootstrap_tenant(a)  # takes one token
        codes = []
        for _ in range(4):
            codes.append((await a.get("/v1/workflow-runs", headers=tenant.headers)).status_code)
            codes.append((await b.get("/v1/workflow-runs", headers=tenant.headers)).status_code)
        assert codes.count(200) == 5 and codes.count(429) == 3, codes
        assert codes[-1] == 429


async def test_key_revoked_through_one_api_process_is_refused_by_another_within_a_quarter_second(
    settings: Settings, harness: object
) -> None:
    first, second = (create_app(settings, runtime=harness.rt) for _ in range(2))  # type: ignore[attr-defined]
    async with make_client(first) as a, make_client(second) as b:
        tenant = await bootstrap_tenant(a)
        extra = await a.post("/v1/api-keys", json={"name": "extra"}, headers=tenant.headers)
        key, key_id = extra.json()["data"]["key"], extra.json()["data"]["id"]
        assert (
            await b.get("/v1/workflow-runs", headers={"x-api-key": key})
        ).status_code == 200  # cached in b
        assert (await a.delete(f"/v1/api-keys/{key_id}", headers=tenant.headers)).status_code == 200
        assert KEY_CACHE_TTL_S <= 0.25  # the documented bound
        await asyncio.sleep(0.3)
        assert (await b.get("/v1/workflow-runs", headers={"x-api-key": key})).status_code == 401
