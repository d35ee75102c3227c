"""The envelope, error mapping, the /api/v1 alias, health and the OpenAPI document."""

from __future__ import annotations

from typing import Any

import httpx
from api_helpers import Tenant, make_client
from fastapi import FastAPI

from stevora.api import create_app
from stevora.engine.brokers import build_broker
from stevora.engine.dispatch import DramatiqDispatcher
from stevora.runtime import Runtime
from stevora.settings import Settings


async def test_unknown_route_is_a_404_envelope(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json() == {
        "success": False,
        "error": {"code": "NOT_FOUND", "message": "Route not found", "details": {}},
    }


async def test_wrong_method_is_a_405_envelope(client: httpx.AsyncClient) -> None:
    response = await client.put("/v1/workspaces")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "METHOD_NOT_ALLOWED"


async def test_malformed_json_is_a_400_validation_error(client: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await client.post(
        "/v1/workflow-runs",
        content=b"{not json",
        headers={**tenant.headers, "content-type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert error["details"]["errors"] == [{"path": "body", "message": "Request body is not valid JSON"}]


async def test_query_parameter_errors_name_the_camel_case_parameter(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await client.get("/v1/workflow-runs?pageSize=0&page=abc", headers=tenant.headers)
    assert response.status_code == 400
    paths = sorted(e["path"] for e in response.json()["error"]["details"]["errors"])
    assert paths == ["page", "pageSize"]


async def test_nul_characters_are_rejected_before_reaching_postgres(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    body = await client.post("/v1/workspaces", json={"name": "bad\x00name", "slug": "nul-test"})
    assert body.status_code == 400
    assert body.json()["error"]["details"]["errors"][0]["path"] == "name"
    query = await client.get("/v1/workflow-definitions", params={"name": "a\x00b"}, headers=tenant.headers)
    assert query.status_code == 400
    path = await client.get("/v1/workflow-runs/wfrun_%00", headers=tenant.headers)
    assert path.status_code == 400


async def test_unexpected_exception_is_a_500_without_internals(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant, monkeypatch: Any
) -> None:
    from stevora.engine import commands

    async def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret connection string postgres://user:pw@db")

    monkeypatch.setattr(commands, "cancel_run", boom)
    response = await client.post("/v1/workflow-runs/wfrun_x/cancel", headers=tenant.headers)
    assert response.status_code == 500
    assert response.json() == {
        "success": False,
        "error": {"code": "INTERNAL_ERROR", "message": "Internal server error", "details": {}},
    }


async def test_api_v1_prefix_is_an_alias_hidden_from_openapi(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await client.get("/api/v1/workspaces/current", headers=tenant.headers)
    assert response.status_code == 200
    assert response.json()["data"]["id"] == tenant.workspace_id
    schema = (await client.get("/openapi.json")).json()
    assert not [p for p in schema["paths"] if p.startswith("/api/")]


async def test_openapi_documents_400_not_422_and_the_error_envelope(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            assert "422" not in operation["responses"], (path, method)
            if "security" in operation:
                assert {"400", "401", "429"} <= set(operation["responses"]), (path, method)
    create = schema["paths"]["/v1/workflow-definitions"]["post"]["requestBody"]
    assert create["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/WorkflowDefinitionInput"
    }
    assert "ErrorEnvelope" in schema["components"]["schemas"]


async def test_health_is_ok_without_auth_on_both_paths(client: httpx.AsyncClient) -> None:
    for path in ("/health", "/v1/health"):
        response = await client.get(path)
        assert response.status_code == 200
        assert response.json() == {
            "success": True,
            "data": {"status": "ok", "checks": {"database": "ok", "queue": "ok"}},
        }


async def test_health_is_503_degraded_when_the_broker_is_unreachable(settings: Settings) -> None:
    dispatcher = DramatiqDispatcher(build_broker("redis://127.0.0.1:1/0"))
    rt = await Runtime.start(settings, dispatcher=dispatcher)
    try:
        async with make_client(create_app(settings, runtime=rt)) as client:
            response = await client.get("/health")
    finally:
        await rt.close()
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "SERVICE_UNAVAILABLE"
    assert error["details"] == {"status": "degraded", "checks": {"database": "ok", "queue": "error"}}


async def test_health_with_stub_broker_reports_queue_ok(settings: Settings) -> None:
    rt = await Runtime.start(settings, dispatcher=DramatiqDispatcher(build_broker("stub://")))
    try:
        async with make_client(create_app(settings, runtime=rt)) as client:
            response = await client.get("/v1/health")
    finally:
        await rt.close()
    assert response.status_code == 200
    assert response.json()["data"]["checks"] == {"database": "ok", "queue": "ok"}
