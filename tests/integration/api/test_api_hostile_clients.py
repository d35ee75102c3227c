"""What a hostile client got through the API's edge and the web UI (issue 29, part 1): other
encodings and content types, deep edits, NUL in every UI route, forms storing what the API refuses.
The rule they pin is docs/security.md, "One way to read a body"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_helpers import DefinitionFactory, Tenant
from fastapi import FastAPI
from fastapi.routing import APIRoute

from stevora.ui import build_ui_router
from stevora.ui.auth import COOKIE_NAME, csrf_token_for
from tests.conftest import Harness

TWO_WAITS = [
    {"type": "wait", "name": "a", "durationMs": 1},
    {"type": "wait", "name": "b", "durationMs": 1},
]


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.fixture
async def ended_run(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> str:
    definition_id = await define(TWO_WAITS)
    created = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )
    assert created.status_code == 201, created.text
    run_id: str = created.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")
    return run_id


async def fork_count(harness: Harness, run_id: str) -> int:
    count: int = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE forked_from_run_id = $1", run_id
    )
    return count


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    return body


# -- one way to read a body ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_types", "status", "code"),
    [
        # UTF-16: FastAPI's json.loads guessed the encoding; the byte scan saw no "NaN" in it.
        (
            '{"at": "b", "edits": {"state": {"x": NaN}}}'.encode("utf-16"),
            ["application/json"],
            400,
            "INVALID_UNICODE",
        ),
        # Two headers: the scan read the last (not JSON: unchecked), FastAPI the first.
        (
            b'{"at": "b", "edits": {"state": {"x": NaN}}}',
            ["application/json", "text/plain"],
            400,
            "VALIDATION_ERROR",
        ),
        # A surrogate encoded as UTF-8 (CESU): json.loads(bytes) decodes with surrogatepass.
        (
            b'{"at": "b", "edits": {"state": {"s": "\xed\xa0\x80"}}}',
            ["application/json"],
            400,
            "INVALID_UNICODE",
        ),
        (b'{"at": "b", "edits": {"state": {"x": 1}}}', ["text/plain"], 415, "UNSUPPORTED_MEDIA_TYPE"),
        (b'{"at": "b", "edits": {"state": {"x": 1}}}', [], 415, "UNSUPPORTED_MEDIA_TYPE"),
        (
            b'{"at": "b", "edits": {"state": {"x": 1}}}',
            ["application/json; charset=latin-1"],
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        ),
        # A BOM: the route's parser skips it, so the body is refused before anyone reads it.
        (
            b'\xef\xbb\xbf{"at": "b", "edits": {"state": {"x": NaN}}}',
            ["application/json"],
            400,
            "VALIDATION_ERROR",
        ),
    ],
    ids=["utf-16", "two-content-types", "cesu-surrogate", "text-plain", "no-content-type", "latin-1", "bom"],
)
async def test_a_fork_body_read_any_other_way_is_refused_and_nothing_is_stored(
    client: httpx.AsyncClient,
    tenant: Tenant,
    harness: Harness,
    ended_run: str,
    body: bytes,
    content_types: list[str],
    status: int,
    code: str,
) -> None:
    headers = [("x-api-key", tenant.key), *(("content-type", t) for t in content_types)]
    response = await client.post(f"/v1/workflow-runs/{ended_run}/fork", content=body, headers=headers)
    assert error(response, status)["code"] == code
    assert await fork_count(harness, ended_run) == 0


async def test_a_replays_system_prompt_with_a_cesu_surrogate_is_refused_not_stored_as_fffd(
    client: httpx.AsyncClient, tenant: Tenant, ended_run: str
) -> None:
    body = b'{"systemPrompt": "be \xed\xa0\x80 brief"}'
    headers = {**tenant.headers, "content-type": "application/json"}
    response = await client.post(f"/v1/workflow-runs/{ended_run}/replay", content=body, headers=headers)
    assert error(response, 400)["code"] == "INVALID_UNICODE"


async def test_bulk_retries_with_a_lone_surrogate_in_run_ids_is_a_400_naming_it(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    headers = {**tenant.headers, "content-type": "application/json"}
    for body in (b'{"runIds": ["\\ud800"]}', b'{"runIds": ["\xed\xa0\x80"]}'):
        response = await client.post("/v1/retries", content=body, headers=headers)
        found = error(response, 400)
        assert found["code"] == "INVALID_UNICODE", found
        assert found["details"]["errors"][0]["path"] in ("runIds[0]", "body")


async def test_utf8_json_with_a_charset_is_read_as_before(
    client: httpx.AsyncClient, tenant: Tenant, ended_run: str
) -> None:
    headers = {**tenant.headers, "content-type": "application/json; charset=UTF-8"}
    body = json.dumps({"at": "b", "edits": {"state": {"note": "é ✓"}}}, ensure_ascii=False).encode()
    response = await client.post(f"/v1/workflow-runs/{ended_run}/fork", content=body, headers=headers)
    assert response.status_code == 201, response.text
    assert response.json()["data"]["state"]["note"] == "é ✓"


# -- deep edits ------------------------------------------------------------------------------------


async def test_a_fork_with_state_edits_300_deep_is_a_400_naming_the_field(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, ended_run: str
) -> None:
    body = {"at": "b", "edits": {"state": {"deep": nested(300)}}}
    response = await client.post(f"/v1/workflow-runs/{ended_run}/fork", json=body, headers=tenant.headers)
    found = error(response, 400)
    assert found["code"] == "JSON_TOO_DEEP"
    assert found["details"]["errors"][0]["path"].startswith("edits.state.deep")
    assert await fork_count(harness, ended_run) == 0


async def test_checkpoints_and_lineage_answer_for_a_run_holding_a_300_deep_value(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, ended_run: str
) -> None:
    """A value stored before the door was shut (or written by other means) must not make the run's
    time-travel reads answer 500 for ever."""
    fork = await client.post(f"/v1/workflow-runs/{ended_run}/fork", json={"at": "b"}, headers=tenant.headers)
    assert fork.status_code == 201, fork.text
    fork_id = fork.json()["data"]["id"]
    deep = nested(300)
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET fork_edits = $2, initial_state = $3 WHERE id = $1",
        fork_id,
        {"state": {"deep": deep}},
        {"deep": deep},
    )
    for path in ("checkpoints", "lineage"):
        response = await client.get(f"/v1/workflow-runs/{fork_id}/{path}", headers=tenant.headers)
        assert response.status_code == 200, (path, response.text[:300])
        assert "$unreadable" in response.text


# -- the web UI ------------------------------------------------------------------------------------


def _ui_routes() -> Iterator[tuple[str, str]]:
    """Every route of the router the app mounts under /ui (read from it: a new page is covered)."""
    for route in build_ui_router().routes:
        if isinstance(route, APIRoute):
            for method in sorted((route.methods or set()) - {"HEAD"}):
                yield method, route.path


UI_ROUTES = sorted(set(_ui_routes()))
_PARAM = re.compile(r"\{[^}]+\}")


@pytest.mark.parametrize(("method", "path"), UI_ROUTES, ids=[f"{m} {p}" for m, p in UI_ROUTES])
async def test_every_ui_route_answers_a_nul_with_a_400_not_a_database_error(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant, ended_run: str, method: str, path: str
) -> None:
    """The NUL is in the path where the route has a parameter, else in the query (GET) or a form
    field (POST); the same with every query parameter the UI reads."""
    client.cookies.set(COOKIE_NAME, tenant.key)
    url = _PARAM.sub("x%00y", path)
    query = "q=%00&a=%00&b=%00&next=%00&at=%00&visit=%00&status=%00&after=%00&definition=%00"
    form = {"csrf": csrf_token_for(tenant.key), "reason": "a\x00b", "key": "a\x00b", "state": "a\x00b"}
    if method == "GET":
        response = await client.get(f"{url}?{query}")
    else:
        response = await client.request(method, url, data=form)
    assert response.status_code == 400, (response.status_code, response.text[:300])
    assert "NUL" in response.text


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ('{"x": NaN}', "INVALID_NUMBER"),
        ('{"x": Infinity}', "INVALID_NUMBER"),
        ('{"n": 123456789012345678901234567890}', "INVALID_NUMBER"),
        ('{"s": "\\ud800"}', "INVALID_UNICODE"),
        ('{"s": "a\\u0000b"}', "NUL"),
        (json.dumps({"deep": nested(300)}), "deeper"),
    ],
    ids=["nan", "infinity", "big-int", "lone-surrogate", "nul", "300-deep"],
)
async def test_the_fork_form_refuses_what_the_api_refuses(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, ended_run: str, state: str, code: str
) -> None:
    client.cookies.set(COOKIE_NAME, tenant.key)
    form = {"csrf": csrf_token_for(tenant.key), "at": "b", "state": state}
    response = await client.post(f"/ui/runs/{ended_run}/fork", data=form)
    assert response.status_code == 400, response.text[:300]
    assert await fork_count(harness, ended_run) == 0
    api = await client.post(
        f"/v1/workflow-runs/{ended_run}/fork",
        content=b'{"at": "b", "edits": {"state": ' + state.encode() + b"}}",
        headers={**tenant.headers, "content-type": "application/json"},
    )
    assert api.status_code == 400, api.text[:300]
    assert code in api.text


async def test_a_ui_form_that_is_not_utf8_is_refused_not_stored_as_fffd(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, ended_run: str
) -> None:
    client.cookies.set(COOKIE_NAME, tenant.key)
    body = f"csrf={csrf_token_for(tenant.key)}&at=b&state=%7B%22s%22%3A%22%ED%A0%80%22%7D".encode()
    response = await client.post(
        f"/ui/runs/{ended_run}/fork",
        content=body,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 400, response.text[:300]
    assert await fork_count(harness, ended_run) == 0


# -- idempotency keys --------------------------------------------------------------------------------


async def test_an_idempotency_key_answers_only_its_own_kind_of_request(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, ended_run: str
) -> None:
    fork_headers = {**tenant.headers, "Idempotency-Key": "k-fork"}
    fork = await client.post(f"/v1/workflow-runs/{ended_run}/fork", json={"at": "b"}, headers=fork_headers)
    assert fork.status_code == 201, fork.text
    again = await client.post(f"/v1/workflow-runs/{ended_run}/fork", json={"at": "b"}, headers=fork_headers)
    assert again.status_code == 200 and again.json()["data"]["id"] == fork.json()["data"]["id"]

    replay = await client.post(f"/v1/workflow-runs/{ended_run}/replay", json={}, headers=fork_headers)
    found = error(replay, 409)
    assert found["code"] == "CONFLICT"
    assert "fork of run" in found["message"] and "replay of run" in found["message"]
    assert found["details"]["existingRunId"] == fork.json()["data"]["id"]

    definition_id = await define(TWO_WAITS)
    run = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition_id, "idempotencyKey": "k-fork"},
        headers=tenant.headers,
    )
    assert error(run, 409)["details"]["requested"] == "a new run"

    # A fork of another run with the key of this one's fork is another request too.
    other = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition_id, "idempotencyKey": "k-run"},
        headers=tenant.headers,
    )
    assert other.status_code == 201, other.text
    forked_run = await client.post(
        f"/v1/workflow-runs/{ended_run}/fork",
        json={"at": "b"},
        headers={**tenant.headers, "Idempotency-Key": "k-run"},
    )
    assert error(forked_run, 409)["details"]["usedFor"] == "a new run"


# -- the published schema is what the server takes -----------------------------------------------


def _body_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    content = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    ref = content["schema"]["$ref"].rsplit("/", 1)[-1]
    schema: dict[str, Any] = document["components"]["schemas"][ref]
    return schema


@pytest.mark.parametrize(
    ("path", "required", "field"),
    [
        ("/v1/workflow-runs/{run_id}/fork", ["at"], "edits"),
        ("/v1/workflow-runs/{run_id}/replay", [], "systemPrompt"),
        ("/v1/replays", [], "runIds"),
        ("/v1/retries", [], "dryRun"),
    ],
)
def test_time_travel_bodies_are_published_with_their_fields_and_no_others(
    app: FastAPI, path: str, required: list[str], field: str
) -> None:
    schema = _body_schema(app.openapi(), path)
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert field in schema["properties"]
    assert schema.get("required", []) == required


async def test_time_travel_bodies_refuse_unknown_fields_and_wrong_types_naming_them(
    client: httpx.AsyncClient, tenant: Tenant, ended_run: str
) -> None:
    cases = [
        (f"/v1/workflow-runs/{ended_run}/fork", {"at": "b", "extra": 1}, "extra"),
        (f"/v1/workflow-runs/{ended_run}/fork", {"at": {"step": "b", "round": True}}, "at"),
        (f"/v1/workflow-runs/{ended_run}/replay", {"unmatched": "sometimes"}, "unmatched"),
        ("/v1/replays", {"definition": "x", "last": True}, "last"),
        ("/v1/retries", {"definition": "x", "dryRun": "yes"}, "dryRun"),
    ]
    for path, body, named in cases:
        response = await client.post(path, json=body, headers=tenant.headers)
        found = error(response, 400)
        paths = [p["path"] for p in found["details"]["errors"]]
        assert any(p.startswith(named) for p in paths), (path, body, paths)


async def test_compare_refuses_what_its_schema_refuses_and_nothing_else(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant
) -> None:
    (param,) = app.openapi()["paths"]["/v1/replays/compare"]["get"]["parameters"]
    assert param["schema"]["minLength"] == 1 and param["schema"]["pattern"] == r"[^,\s]"
    for runs in ("", ",", " , "):
        response = await client.get("/v1/replays/compare", params={"runs": runs}, headers=tenant.headers)
        assert error(response, 400)["details"]["errors"][0]["path"] == "runs"


async def test_a_budget_limit_must_be_a_number_not_a_boolean(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory
) -> None:
    definition_id = await define([{"type": "wait", "name": "w", "durationMs": 60_000}])
    created = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )
    run_id = created.json()["data"]["id"]
    for body in (
        {"maxModelCalls": False},
        {"maxToolCalls": True},
        {"maxCostCents": False},
        {"maxModelCalls": "3"},
    ):
        response = await client.post(f"/v1/workflow-runs/{run_id}/budget", json=body, headers=tenant.headers)
        assert error(response, 400)["details"]["errors"][0]["path"] == next(iter(body)), body
    fine = await client.post(
        f"/v1/workflow-runs/{run_id}/budget", json={"maxModelCalls": 3}, headers=tenant.headers
    )
    assert fine.status_code == 200, fine.text


@pytest.mark.parametrize(("method", "path"), UI_ROUTES, ids=[f"{m} {p}" for m, p in UI_ROUTES])
async def test_every_ui_route_answers_bytes_that_are_not_utf8_without_a_server_error(
    client: httpx.AsyncClient, tenant: Tenant, ended_run: str, method: str, path: str
) -> None:
    client.cookies.set(COOKIE_NAME, tenant.key)
    url = _PARAM.sub("x%ED%A0%80y", path)
    if method == "GET":
        response = await client.get(f"{url}?q=%ED%A0%80&a=%ED%A0%80&b=%ED%A0%80&at=%ED%A0%80")
    else:
        body = f"csrf={csrf_token_for(tenant.key)}&reason=%ED%A0%80&state=%ED%A0%80".encode()
        headers = {"content-type": "application/x-www-form-urlencoded"}
        response = await client.request(method, url, content=body, headers=headers)
    assert response.status_code < 500, (response.status_code, response.text[:300])


@pytest.mark.parametrize(
    "path",
    [
        "/v1/workflow-runs/x%ED%A0%80y",
        "/v1/workflow-runs?status=%ED%A0%80",
        "/v1/workflow-definitions/x%ED%A0%80",
    ],
)
async def test_api_paths_and_queries_that_are_not_utf8_are_not_a_server_error(
    client: httpx.AsyncClient, tenant: Tenant, path: str
) -> None:
    response = await client.get(path, headers=tenant.headers)
    assert response.status_code < 500, response.text[:300]


async def test_the_api_v1_alias_reads_bodies_the_same_one_way(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, ended_run: str
) -> None:
    body = '{"at": "b", "edits": {"state": {"x": NaN}}}'.encode("utf-16")
    headers = {**tenant.headers, "content-type": "application/json"}
    response = await client.post(f"/api/v1/workflow-runs/{ended_run}/fork", content=body, headers=headers)
    assert error(response, 400)["code"] == "INVALID_UNICODE"
    assert await fork_count(harness, ended_run) == 0
