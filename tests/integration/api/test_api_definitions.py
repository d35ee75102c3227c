"""Workflow definitions: validated on create, immutable, unique per (name, version)."""

from __future__ import annotations

import asyncio

import httpx
from api_helpers import Tenant

from stevora.ids import new_id

TASK = {"type": "task", "name": "enrich", "handler": "enrich-lead"}


def _definition(name: str, version: str = "1.0.0") -> dict[str, object]:
    return {
        "name": name,
        "version": version,
        "description": "Lead flow",
        "steps": [TASK, {"type": "wait", "name": "pause", "durationMs": 10}],
    }


async def test_create_returns_the_stored_definition(client: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await client.post("/v1/workflow-definitions", json=_definition("lead"), headers=tenant.headers)
    assert response.status_code == 201
    data = response.json()["data"]
    assert set(data) == {
        "id",
        "workspaceId",
        "name",
        "version",
        "description",
        "steps",
        "inputSchema",
        "defaultParams",
        "budget",
        "concurrency",
        "priority",
        "schedule",
        "triggers",
        "createdAt",
        "updatedAt",
    }
    assert data["inputSchema"] is None and data["defaultParams"] is None and data["budget"] is None
    assert data["id"].startswith("wfdef_") and data["workspaceId"] == tenant.workspace_id
    assert data["steps"][0] == {"type": "task", "name": "enrich", "handler": "enrich-lead", "config": {}}
    assert data["steps"][1]["durationMs"] == 10
    got = await client.get(f"/v1/workflow-definitions/{data['id']}", headers=tenant.headers)
    assert got.json()["data"] == data


async def test_every_validation_problem_is_reported_with_its_path(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    body = {
        "name": "",
        "version": "1",
        "steps": [
            {"type": "task", "name": "a"},
            {"type": "teleport", "name": "b"},
            {"type": "task", "name": "a", "handler": "h"},
        ],
    }
    response = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    paths = [e["path"] for e in error["details"]["errors"]]
    assert {"name", "steps[0].handler", "steps[1].type", "steps[2].name"} <= set(paths)


async def test_body_must_be_an_object(client: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await client.post("/v1/workflow-definitions", json=[1, 2], headers=tenant.headers)
    assert response.status_code == 400


async def test_duplicate_name_and_version_is_409_even_under_concurrency(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    name = new_id("dup")
    responses = await asyncio.gather(
        *(
            client.post("/v1/workflow-definitions", json=_definition(name), headers=tenant.headers)
            for _ in range(8)
        )
    )
    assert sorted(r.status_code for r in responses) == [201] + [409] * 7
    conflict = next(r for r in responses if r.status_code == 409).json()["error"]
    assert conflict["code"] == "CONFLICT"
    newer = await client.post(
        "/v1/workflow-definitions", json=_definition(name, "2.0.0"), headers=tenant.headers
    )
    assert newer.status_code == 201


async def test_same_name_and_version_may_exist_in_two_workspaces(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    for who in (tenant, other_tenant):
        response = await client.post(
            "/v1/workflow-definitions", json=_definition("shared"), headers=who.headers
        )
        assert response.status_code == 201


async def test_list_is_paginated_and_filters_by_name(client: httpx.AsyncClient, tenant: Tenant) -> None:
    for version in ("1", "2", "3"):
        await client.post(
            "/v1/workflow-definitions", json=_definition("paged", version), headers=tenant.headers
        )
    await client.post("/v1/workflow-definitions", json=_definition("other"), headers=tenant.headers)
    response = await client.get(
        "/v1/workflow-definitions?name=paged&pageSize=2&page=2", headers=tenant.headers
    )
    assert response.status_code == 200
    body = response.json()
    assert body["meta"] == {"page": 2, "pageSize": 2, "total": 3, "totalPages": 2}
    assert [d["version"] for d in body["data"]] == ["1"]  # newest first
    everything = (await client.get("/v1/workflow-definitions", headers=tenant.headers)).json()
    assert everything["meta"]["total"] == 4 and everything["meta"]["pageSize"] == 20


async def test_another_workspaces_definition_is_404(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    created = await client.post("/v1/workflow-definitions", json=_definition("mine"), headers=tenant.headers)
    definition_id = created.json()["data"]["id"]
    response = await client.get(f"/v1/workflow-definitions/{definition_id}", headers=other_tenant.headers)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"
    listed = (await client.get("/v1/workflow-definitions", headers=other_tenant.headers)).json()
    assert listed["meta"]["total"] == 0


async def test_definitions_are_immutable(client: httpx.AsyncClient, tenant: Tenant) -> None:
    created = await client.post("/v1/workflow-definitions", json=_definition("fixed"), headers=tenant.headers)
    definition_id = created.json()["data"]["id"]
    for method in ("PUT", "PATCH", "DELETE"):
        response = await client.request(
            method, f"/v1/workflow-definitions/{definition_id}", headers=tenant.headers
        )
        assert response.status_code == 405
