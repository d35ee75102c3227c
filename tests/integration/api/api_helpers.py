"""Helpers shared by the API tests (a plain module: conftest modules are not importable by name)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from jsonschema import Draft202012Validator

from stevora.ids import new_id


@dataclass(frozen=True)
class Tenant:
    """A workspace and a working API key for it."""

    workspace_id: str
    key: str
    key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"x-api-key": self.key}


def make_client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def bootstrap_tenant(client: httpx.AsyncClient, **workspace_headers: str) -> Tenant:
    slug = new_id("t").replace("_", "-")
    ws = await client.post("/v1/workspaces", json={"name": "Tenant", "slug": slug}, headers=workspace_headers)
    assert ws.status_code == 201, ws.text
    workspace_id = ws.json()["data"]["id"]
    key = await client.post(
        "/v1/api-keys", json={"name": "first", "workspaceId": workspace_id}, headers=workspace_headers
    )
    assert key.status_code == 201, key.text
    data = key.json()["data"]
    return Tenant(workspace_id, data["key"], data["id"])


DefinitionFactory = Callable[..., Awaitable[str]]
"""The `define` fixture: POST a definition (steps, name=, as_=tenant) and return its id."""


Conforms = Callable[[httpx.Response, str, str], None]
"""The `conforms` fixture: assert a response matches the app's OpenAPI for (method, path template)."""


def check_conformance(openapi: dict[str, Any], response: httpx.Response, method: str, path: str) -> None:
    operation = openapi["paths"][path][method.lower()]
    documented = operation["responses"][str(response.status_code)]
    schema = documented["content"]["application/json"]["schema"]
    Draft202012Validator({**schema, "components": openapi["components"]}).validate(response.json())
