"""Workspaces and API keys over HTTP."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from api_helpers import Conforms, Tenant, bootstrap_tenant, make_client

from stevora.api import create_app
from stevora.ids import new_id
from stevora.settings import Settings

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _slug() -> str:
    return new_id("s").replace("_", "-")


async def test_create_workspace_returns_201_with_documented_fields(client: httpx.AsyncClient) -> None:
    slug = _slug()
    response = await client.post("/v1/workspaces", json={"name": "Acme Corp", "slug": slug})
    assert response.status_code == 201
    body = response.json()
    assert body["success"] is True
    data = body["data"]
    assert set(data) == {"id", "name", "slug", "createdAt", "updatedAt"}
    assert data["id"].startswith("ws_") and data["name"] == "Acme Corp" and data["slug"] == slug
    assert ISO_MS.match(data["createdAt"]) and ISO_MS.match(data["updatedAt"])


async def test_duplicate_slug_is_409_conflict(client: httpx.AsyncClient) -> None:
    slug = _slug()
    assert (await client.post("/v1/workspaces", json={"name": "A", "slug": slug})).status_code == 201
    response = await client.post("/v1/workspaces", json={"name": "B", "slug": slug})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "CONFLICT"


async def test_workspace_name_and_slug_are_validated(client: httpx.AsyncClient) -> None:
    cases = [
        ({"name": "", "slug": "ok"}, "name"),
        ({"name": "x" * 101, "slug": "ok"}, "name"),
        ({"name": "A", "slug": "Has Caps"}, "slug"),
        ({"name": "A", "slug": "under_score"}, "slug"),
        ({"name": "A", "slug": "x" * 51}, "slug"),
        ({"name": "A"}, "slug"),
    ]
    for body, path in cases:
        response = await client.post("/v1/workspaces", json=body)
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert error["code"] == "VALIDATION_ERROR"
        assert [e["path"] for e in error["details"]["errors"]] == [path], body


async def test_current_workspace_is_the_keys_workspace(client: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await client.get("/v1/workspaces/current", headers=tenant.headers)
    assert response.status_code == 200
    assert response.json()["data"]["id"] == tenant.workspace_id


async def test_api_key_create_list_and_revoke(
    client: httpx.AsyncClient, tenant: Tenant, conforms: Conforms
) -> None:
    created = await client.post("/v1/api-keys", json={"name": "CI"}, headers=tenant.headers)
    assert created.status_code == 201
    conforms(created, "POST", "/v1/api-keys")
    data = created.json()["data"]
    assert {"id", "workspaceId", "name", "key", "createdAt"} <= set(data)
    assert data["workspaceId"] == tenant.workspace_id and data["name"] == "CI"

    listed = await client.get("/v1/api-keys", headers=tenant.headers)
    assert listed.status_code == 200
    conforms(listed, "GET", "/v1/api-keys")
    keys = listed.json()["data"]
    assert isinstance(keys, list) and "meta" not in listed.json()
    assert [k["name"] for k in keys] == ["first", "CI"]
    for key in keys:
        assert set(key) == {"id", "workspaceId", "name", "keyPrefix", "lastUsedAt", "createdAt", "revokedAt"}
    assert keys[1]["keyPrefix"] == data["key"][:8] and keys[1]["revokedAt"] is None

    first = await client.delete(f"/v1/api-keys/{data['id']}", headers=tenant.headers)
    again = await client.delete(f"/v1/api-keys/{data['id']}", headers=tenant.headers)
    assert first.status_code == again.status_code == 200
    assert first.json()["data"]["revokedAt"] == again.json()["data"]["revokedAt"] is not None


async def test_api_key_name_is_required(client: httpx.AsyncClient, tenant: Tenant) -> None:
    for body in ({}, {"name": ""}, {"name": "x" * 101}):
        response = await client.post("/v1/api-keys", json=body, headers=tenant.headers)
        assert response.status_code == 400
        assert response.json()["error"]["details"]["errors"][0]["path"] == "name"


async def test_keys_of_another_workspace_are_invisible(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    response = await client.delete(f"/v1/api-keys/{other_tenant.key_id}", headers=tenant.headers)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"
    listed = (await client.get("/v1/api-keys", headers=tenant.headers)).json()["data"]
    assert other_tenant.key_id not in {k["id"] for k in listed}
    assert (await client.get("/v1/workspaces/current", headers=other_tenant.headers)).status_code == 200


async def test_empty_admin_token_from_compose_counts_as_unset(
    harness: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docker-compose.yml passes `ADMIN_TOKEN: ${ADMIN_TOKEN:-}`, i.e. "" when the host has none.
    monkeypatch.setenv("ADMIN_TOKEN", "")
    settings = Settings(database_url=database_url, rate_limit_per_minute=0)
    assert settings.admin_token is None
    async with make_client(create_app(settings, runtime=harness.rt)) as client:
        tenant = await bootstrap_tenant(client)
        response = await client.get("/v1/workspaces/current", headers=tenant.headers)
    assert response.status_code == 200


def test_blank_provider_keys_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "  ")
    settings = Settings()
    assert settings.openai_api_key is None and settings.anthropic_api_key is None
