"""A step's outputSchema that its structuredOutput mode cannot take is refused when the definition
is stored (400 naming the field), never when the run gets there."""

from __future__ import annotations

import base64
from typing import Any

import httpx
from api_helpers import Tenant

from stevora.ids import new_id


def _body(step: dict[str, Any]) -> dict[str, Any]:
    llm = {
        "type": "llm",
        "name": "ask",
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "x"}],
    }
    return {
        "name": new_id("so"),
        "version": "1.0.0",
        "steps": [{"type": "wait", "name": "w", "durationMs": 1}, {**llm, **step}],
    }


async def test_an_explicitly_native_schema_strict_mode_refuses_is_a_400_naming_the_field(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    schema = {
        "type": "object",
        "properties": {"meta": {"type": "object", "additionalProperties": {"type": "string"}}},
        "required": ["meta"],
    }
    response = await client.post(
        "/v1/workflow-definitions",
        json=_body({"structuredOutput": "native", "outputSchema": schema}),
        headers=tenant.headers,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    (problem,) = error["details"]["errors"]
    assert problem["path"] == "steps[1].outputSchema.properties.meta.additionalProperties"
    assert "closed object" in problem["message"]


async def test_the_same_schema_without_an_explicit_mode_is_stored_and_falls_back_at_run_time(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    schema = {"type": "object", "properties": {"meta": {"type": "object", "additionalProperties": True}}}
    response = await client.post(
        "/v1/workflow-definitions", json=_body({"outputSchema": schema}), headers=tenant.headers
    )
    assert response.status_code == 201, response.text


async def test_a_step_with_an_output_schema_cannot_declare_a_tool_named_final_answer(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    tool = {"name": "final_answer", "description": "d", "parameters": {"type": "object"}}
    response = await client.post(
        "/v1/workflow-definitions",
        json=_body({"outputSchema": {"a": {"type": "string"}}, "tools": [tool]}),
        headers=tenant.headers,
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"]["errors"][0]["path"] == "steps[1].tools[0].name"


async def test_structured_output_tool_with_thinking_is_a_400_naming_structured_output(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    step = {
        "model": "claude-sonnet-4-5",
        "maxTokens": 4000,
        "thinking": {"budgetTokens": 2000},
        "outputSchema": {"a": {"type": "string"}},
    }
    refused = await client.post(
        "/v1/workflow-definitions", json=_body({**step, "structuredOutput": "tool"}), headers=tenant.headers
    )
    assert refused.status_code == 400, refused.text
    (problem,) = refused.json()["error"]["details"]["errors"]
    assert problem["path"] == "steps[1].structuredOutput"
    assert "cannot be combined with thinking" in problem["message"]
    for mode in ("native", "prompt", None):
        body = _body(step if mode is None else {**step, "structuredOutput": mode})
        stored = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
        assert stored.status_code == 201, (mode, stored.text)


def _shot_definition() -> dict[str, Any]:
    part = {"type": "image", "mediaType": "image/png", "data": "{{input.shot}}"}
    llm = {
        "type": "llm",
        "name": "look",
        "model": "scripted",
        "messages": [{"role": "user", "content": [part]}],
    }
    return {"name": new_id("img"), "version": "1.0.0", "steps": [llm]}


async def test_run_input_sent_as_an_image_is_checked_when_the_run_is_created(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    created = await client.post("/v1/workflow-definitions", json=_shot_definition(), headers=tenant.headers)
    assert created.status_code == 201, created.text
    definition_id = created.json()["data"]["id"]

    async def start(shot: str) -> httpx.Response:
        return await client.post(
            "/v1/workflow-runs",
            json={"definitionId": definition_id, "input": {"shot": shot}},
            headers=tenant.headers,
        )

    not_base64 = await start("iVBOR w0K")
    assert not_base64.status_code == 400, not_base64.text
    (problem,) = not_base64.json()["error"]["details"]["errors"]
    assert problem["path"] == "input.shot" and "base64" in problem["message"]
    gif_said_png = await start(base64.b64encode(b"GIF89a" + b"0" * 10).decode())
    assert gif_said_png.status_code == 400
    assert "not a image/png file" in gif_said_png.json()["error"]["details"]["errors"][0]["message"]
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"0" * 10).decode()
    assert (await start(png)).status_code == 201
