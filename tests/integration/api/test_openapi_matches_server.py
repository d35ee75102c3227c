"""The OpenAPI document states the rules the server enforces, and the server answers as it says.

Property-based testing of the document (schemathesis' positive-data, unsupported-method and
response-schema checks) found requests the document called valid that the server refused, wrong
`Allow` headers on 405 answers, and a stream documented as a string. Each case is held here both
ways: the document's own schema refuses the request, and the server refuses it with a 400 naming
the field; a near miss the document accepts is not refused with a 400.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from api_helpers import DefinitionFactory, Tenant
from fastapi import FastAPI
from jsonschema import Draft202012Validator

from tests.conftest import Harness

STEPS = [{"type": "wait", "name": "nap", "durationMs": 5}]
METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture
def document(app: FastAPI) -> dict[str, Any]:
    return app.openapi()


def _validator(document: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator({**schema, "components": document["components"]})


def body_valid(document: dict[str, Any], method: str, path: str, body: Any) -> bool:
    operation = document["paths"][path][method]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    return _validator(document, schema).is_valid(body)


def param_valid(document: dict[str, Any], method: str, path: str, name: str, value: str) -> bool:
    operation = document["paths"][path][method]
    (param,) = [p for p in operation["parameters"] if p["name"] == name]
    return _validator(document, param["schema"]).is_valid(value)


def field_problem(response: httpx.Response) -> list[str]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    return [p["path"] for p in error["details"]["errors"]]


# (operation path, body the server refuses, the field it names, a near miss both accept)
BODY_CASES = {
    "NUL in a body string": (
        "/v1/workflow-definitions",
        {"name": "a\x00b", "version": "1", "steps": STEPS}, "name",
        {"name": "ab", "version": "1", "steps": STEPS},
    ),
    "step without type": (
        "/v1/workflow-definitions",
        {"name": "typeless", "version": "1", "steps": [{"name": "nap", "durationMs": 5}]}, "steps[0]",
        {"name": "typed", "version": "1", "steps": STEPS},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", BODY_CASES)
async def test_definition_bodies_the_server_refuses_the_document_refuses(
    case: str, client: httpx.AsyncClient, tenant: Tenant, document: dict[str, Any]
) -> None:
    path, refused, field, accepted = BODY_CASES[case]
    assert not body_valid(document, "post", path, refused), f"the document accepts: {refused}"
    response = await client.post(path, json=refused, headers=tenant.headers)
    assert any(p.startswith(field) for p in field_problem(response)), response.text
    assert body_valid(document, "post", path, accepted)
    assert (await client.post(path, json=accepted, headers=tenant.headers)).status_code == 201


async def test_nul_in_a_path_a_query_and_a_free_form_value(
    client: httpx.AsyncClient, tenant: Tenant, document: dict[str, Any], define: DefinitionFactory
) -> None:
    run_path, runs = "/v1/workflow-runs/{run_id}", "/v1/workflow-runs"
    assert not param_valid(document, "get", run_path, "run_id", "wfrun_\x00")
    assert param_valid(document, "get", run_path, "run_id", "wfrun_x")
    assert field_problem(await client.get("/v1/workflow-runs/wfrun_%00", headers=tenant.headers)) == ["path"]

    assert not param_valid(document, "get", runs, "definitionId", "wfdef_\x00")
    response = await client.get(runs, params={"definitionId": "wfdef_\x00"}, headers=tenant.headers)
    assert field_problem(response) == ["definitionId"]

    definition_id = await define(STEPS)
    nested = {"definitionId": definition_id, "input": {"notes": [{"text": "a\x00b"}]}}
    assert not body_valid(document, "post", runs, nested)
    assert field_problem(await client.post(runs, json=nested, headers=tenant.headers)) == [
        "input.notes[0].text"
    ]
    bad_key = {"definitionId": definition_id, "input": {"a\x00": 1}}
    assert not body_valid(document, "post", runs, bad_key)
    assert (await client.post(runs, json=bad_key, headers=tenant.headers)).status_code == 400
    fine = {"definitionId": definition_id, "input": {"notes": [{"text": "ab"}]}}
    assert body_valid(document, "post", runs, fine)
    assert (await client.post(runs, json=fine, headers=tenant.headers)).status_code == 201


@pytest.mark.parametrize("body", [{"decision": "edited"}, {"decision": "edited", "editedContent": None}])
async def test_an_edit_without_content(
    body: dict[str, Any], client: httpx.AsyncClient, tenant: Tenant, document: dict[str, Any]
) -> None:
    path = "/v1/approval-requests/{approval_id}/decide"
    assert not body_valid(document, "post", path, body)
    response = await client.post("/v1/approval-requests/apr_x/decide", json=body, headers=tenant.headers)
    assert field_problem(response) == ["editedContent"]
    for fine in ({"decision": "approved"}, {"decision": "rejected", "editedContent": None},
                 {"decision": "edited", "editedContent": {"subject": "Hi"}}):  # fmt: skip
        assert body_valid(document, "post", path, fine), fine
        answered = await client.post("/v1/approval-requests/apr_x/decide", json=fine, headers=tenant.headers)
        assert answered.status_code == 404, answered.text  # valid; there is no such approval


@pytest.mark.parametrize(
    "item",
    [{"toolCallId": "c1"}, {"toolCallId": "c1", "output": None, "error": "boom"},
     {"toolCallId": "c1", "output": 1, "error": "boom"}, {"toolCallId": "c1", "error": None}],
)  # fmt: skip
async def test_a_tool_output_needs_exactly_one_of_output_or_error(
    item: dict[str, Any], client: httpx.AsyncClient, tenant: Tenant, document: dict[str, Any]
) -> None:
    path = "/v1/workflow-runs/{run_id}/tool-outputs"
    assert not body_valid(document, "post", path, {"toolOutputs": [item]}), item
    response = await client.post(
        "/v1/workflow-runs/wfrun_x/tool-outputs", json={"toolOutputs": [item]}, headers=tenant.headers
    )
    assert field_problem(response) == ["toolOutputs[0]"]
    for fine in ({"toolCallId": "c1", "output": None}, {"toolCallId": "c1", "output": {"a": 1}},
                 {"toolCallId": "c1", "error": "boom"}, {"toolCallId": "c1", "output": "text", "error": None}):  # fmt: skip
        assert body_valid(document, "post", path, {"toolOutputs": [fine]}), fine
        answered = await client.post(
            "/v1/workflow-runs/wfrun_x/tool-outputs", json={"toolOutputs": [fine]}, headers=tenant.headers
        )
        assert answered.status_code == 404, answered.text  # valid; there is no such run


async def test_resume_without_a_signal_of_a_run_that_is_not_paused_is_a_conflict_not_a_bad_body(
    client: httpx.AsyncClient, tenant: Tenant, document: dict[str, Any], define: DefinitionFactory,
    harness: Harness,
) -> None:  # fmt: skip
    definition_id = await define([{"type": "external_event", "name": "wait", "signalType": "go"}])
    run_id = (
        await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers)
    ).json()["data"]["id"]
    await harness.wait_for_status(run_id, "WAITING")
    path = "/v1/workflow-runs/{run_id}/resume"
    for body in (None, {}, {"payload": {"a": 1}}):
        if body is not None:
            assert body_valid(document, "post", path, body)
        response = await client.post(f"/v1/workflow-runs/{run_id}/resume", json=body, headers=tenant.headers)
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "INVALID_STATE_TRANSITION" and "signalType" in error["message"]
        assert "409" in document["paths"][path]["post"]["responses"]
    sent = await client.post(
        f"/v1/workflow-runs/{run_id}/resume", json={"signalType": "go"}, headers=tenant.headers
    )
    assert sent.status_code == 200, sent.text


async def test_every_405_allows_exactly_the_documented_methods(
    client: httpx.AsyncClient, tenant: Tenant, document: dict[str, Any]
) -> None:
    checked = 0
    for template, item in document["paths"].items():
        documented = {m.upper() for m in item if m in METHODS}
        path = template.replace("{", "x_").replace("}", "")
        for method in (m for m in METHODS if m.upper() not in documented):
            response = await client.request(method.upper(), path, headers=tenant.headers)
            assert response.status_code == 405, (method, path, response.status_code)
            allowed = {m.strip() for m in response.headers["allow"].split(",")}
            assert allowed == documented, f"{method.upper()} {path}: Allow {allowed}, documented {documented}"
            checked += 1
    assert checked > 40


async def test_the_event_stream_is_documented_message_by_message(
    client: httpx.AsyncClient, tenant: Tenant, document: dict[str, Any], define: DefinitionFactory,
    harness: Harness,
) -> None:  # fmt: skip
    operation = document["paths"]["/v1/workflow-runs/{run_id}/events/stream"]["get"]
    schema = operation["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert schema["type"] == "object" and {"id", "event", "data"} <= schema["properties"].keys()
    run = await client.post(
        "/v1/workflow-runs", json={"definitionId": await define(STEPS)}, headers=tenant.headers
    )
    run_id = run.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")
    response = await client.get(f"/v1/workflow-runs/{run_id}/events/stream", headers=tenant.headers)
    messages = []
    for block in response.text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            messages.append(fields)
    events = [m["event"] for m in messages]
    assert events[0] == "WORKFLOW_STARTED" and events[-1] == "WORKFLOW_COMPLETED", events
    validator = _validator(document, schema)
    for message in messages:
        validator.validate(message)
        assert json.loads(message["data"])["sequence"] == int(message["id"])
