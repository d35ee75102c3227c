"""The synchronous agent API (issue 22, "Stewrd users"): a run request that waits, bounded, for the
run to settle (`?wait=` / `Prefer: wait=`), ad-hoc runs with inline tools and no stored
definition, and the expiry of a run that waits for client tool outputs nobody sends."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from api_helpers import Conforms, DefinitionFactory, Tenant, bootstrap_tenant, make_client

from stevora.api import create_app
from stevora.api.request_wait import requested_wait
from stevora.definitions.llm_step import MAX_TOOL_ROUNDS_CEILING
from stevora.settings import Settings
from tests.awaited_tools import LOCATION, WEATHER
from tests.conftest import Harness


def agent(*tools: Any, **extra: Any) -> dict[str, Any]:
    return {
        "type": "llm",
        "name": "agent",
        "model": "scripted",
        "messages": [{"role": "user", "content": "What should I wear?"}],
        "tools": list(tools),
        **extra,
    }


def timer(ms: int = 60_000) -> dict[str, Any]:
    return {"type": "wait", "name": "pause", "durationMs": ms}


async def test_create_with_wait_answers_with_the_required_action_and_outputs_with_wait_the_end(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, conforms: Conforms
) -> None:
    """The client-tool loop in two requests, no polling, SSE or webhook: fails on a server that
    answers create with PENDING."""
    definition_id = await define([agent(WEATHER)])
    created = await client.post(
        "/v1/workflow-runs?wait=10", json={"definitionId": definition_id}, headers=tenant.headers
    )
    assert created.status_code == 201, created.text
    conforms(created, "post", "/v1/workflow-runs")
    run = created.json()["data"]
    assert run["status"] == "WAITING"
    (call,) = run["requiredAction"]["toolCalls"]
    assert call["name"] == "get_weather"

    answered = await client.post(
        f"/v1/workflow-runs/{run['id']}/tool-outputs",
        json={"toolOutputs": [{"toolCallId": call["id"], "output": "18°C, light rain"}]},
        headers={**tenant.headers, "Prefer": "respond-async, wait=10"},
    )
    assert answered.status_code == 200, answered.text
    assert answered.headers["Preference-Applied"] == "wait=10"
    done = answered.json()["data"]
    assert done["status"] == "COMPLETED", done["status"]
    assert done["requiredAction"] is None
    assert "18°C, light rain" in done["state"]["agent"]


async def test_the_wait_ends_at_its_bound_with_the_run_as_it_is(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory
) -> None:
    """A run waiting on a timer is not settled: the answer comes at the bound, WAITING."""
    definition_id = await define([timer()])
    began = time.monotonic()
    created = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition_id},
        headers={**tenant.headers, "Prefer": "wait=0.6"},
    )
    took = time.monotonic() - began
    assert created.status_code == 201, created.text
    assert created.json()["data"]["status"] == "WAITING"
    assert created.json()["data"]["requiredAction"] is None
    assert 0.6 <= took < 3.0, took

    # GET ?wait= is the long poll that picks up from there.
    run_id = created.json()["data"]["id"]
    began = time.monotonic()
    got = await client.get(f"/v1/workflow-runs/{run_id}?wait=0.3", headers=tenant.headers)
    assert got.status_code == 200 and got.json()["data"]["status"] == "WAITING"
    assert 0.3 <= time.monotonic() - began < 3.0
    assert "Preference-Applied" not in got.headers  # asked with a query parameter, not a preference


async def test_a_run_that_fails_answers_the_wait_at_once(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory
) -> None:
    definition_id = await define([{"type": "task", "name": "boom", "handler": "no_such_handler"}])
    began = time.monotonic()
    created = await client.post(
        "/v1/workflow-runs?wait=20", json={"definitionId": definition_id}, headers=tenant.headers
    )
    assert created.json()["data"]["status"] == "FAILED", created.text
    assert time.monotonic() - began < 10


async def test_the_wait_is_capped_by_the_setting(
    harness: Harness, settings: Settings, tenant: Tenant, define: DefinitionFactory
) -> None:
    capped = create_app(settings.model_copy(update={"max_request_wait_s": 0.2}), runtime=harness.rt)
    definition_id = await define([timer()])
    async with make_client(capped) as c:
        began = time.monotonic()
        created = await c.post(
            "/v1/workflow-runs",
            json={"definitionId": definition_id},
            headers={**tenant.headers, "Prefer": "wait=30"},
        )
        assert time.monotonic() - began < 3.0
    assert created.status_code == 201
    assert created.headers["Preference-Applied"] == "wait=0.2"


async def test_a_negative_wait_is_refused_naming_the_field(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory
) -> None:
    definition_id = await define([timer()])
    response = await client.post(
        "/v1/workflow-runs?wait=-1", json={"definitionId": definition_id}, headers=tenant.headers
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "VALIDATION_ERROR"
    assert "wait" in response.text
    listed = await client.get("/v1/workflow-runs", headers=tenant.headers)
    assert listed.json()["meta"]["total"] == 0  # nothing half-written


@pytest.mark.parametrize(
    ("query", "prefer", "expected"),
    [
        (None, None, None),
        (5.0, "wait=9", 5.0),  # the query parameter wins
        (None, "wait=9", 9.0),
        (None, "handling=lenient; wait=100", 60.0),  # capped
        (None, "wait=soon", None),  # a preference the server cannot read is ignored
        (None, "wait=-3", None),
        (None, 'wait="4"', 4.0),
    ],
)
def test_requested_wait(query: float | None, prefer: str | None, expected: float | None) -> None:
    assert requested_wait(query, prefer, 60.0) == expected


async def test_an_ad_hoc_run_with_inline_tools_needs_no_stored_definition(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    """Stewrd's form: tools sent with the request. Fails on a server that requires definitionId."""
    body = {"definition": {"steps": [agent(WEATHER)]}, "input": {}}
    created = await client.post("/v1/workflow-runs?wait=10", json=body, headers=tenant.headers)
    assert created.status_code == 201, created.text
    run = created.json()["data"]
    assert run["requiredAction"]["toolCalls"][0]["name"] == "get_weather"

    # Stored under a generated definition: `adhoc` at a digest of its content, reused after.
    definition = await client.get(f"/v1/workflow-definitions/{run['definitionId']}", headers=tenant.headers)
    assert definition.json()["data"]["name"] == "adhoc"
    assert definition.json()["data"]["version"].startswith("adhoc-")
    again = await client.post("/v1/workflow-runs", json=body, headers=tenant.headers)
    assert again.json()["data"]["definitionId"] == run["definitionId"]
    other = await client.post(
        "/v1/workflow-runs", json={"definition": {"steps": [agent(LOCATION)]}}, headers=tenant.headers
    )
    assert other.json()["data"]["definitionId"] != run["definitionId"]

    # A named, versioned one is immutable like any definition.
    named = {"name": "desk", "version": "1", "steps": [agent(WEATHER)]}
    first = await client.post("/v1/workflow-runs", json={"definition": named}, headers=tenant.headers)
    assert first.status_code == 201, first.text
    changed = {**named, "steps": [agent(LOCATION)]}
    conflict = await client.post("/v1/workflow-runs", json={"definition": changed}, headers=tenant.headers)
    assert conflict.status_code == 409
    assert conflict.json()["error"]["details"] == {"name": "desk", "version": "1"}


async def test_an_ad_hoc_definition_is_validated_with_paths_under_definition(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    bad = {"definition": {"steps": [{**agent(WEATHER), "maxToolRounds": MAX_TOOL_ROUNDS_CEILING + 1}]}}
    response = await client.post("/v1/workflow-runs", json=bad, headers=tenant.headers)
    assert response.status_code == 400
    paths = [e["path"] for e in response.json()["error"]["details"]["errors"]]
    assert paths == ["definition.steps[0].maxToolRounds"]
    both = {"definitionId": "wfdef_x", "definition": {"steps": [timer()]}}
    response = await client.post("/v1/workflow-runs", json=both, headers=tenant.headers)
    assert response.status_code == 400
    assert response.json()["error"]["details"]["errors"] == [
        {"path": "definition", "message": "Give exactly one of definitionId or definition"}
    ]
    stored = await client.get("/v1/workflow-definitions", headers=tenant.headers)
    assert stored.json()["meta"]["total"] == 0


async def test_a_run_waiting_for_outputs_nobody_sends_expires_with_context_expired(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    """Stewrd's `context_expired`, durable: fails on a server that waits forever."""
    definition_id = await define([agent(WEATHER, outputsExpireAfterMs=2000)])
    created = await client.post(
        "/v1/workflow-runs?wait=10", json={"definitionId": definition_id}, headers=tenant.headers
    )
    run = created.json()["data"]
    assert run["status"] == "WAITING" and run["nextRunAt"] is not None
    call_id = run["requiredAction"]["toolCalls"][0]["id"]

    # The wait answers at once while the action is required; the expiry then ends the run.
    await harness.wait_for_status(run["id"], "FAILED")
    failed = (await client.get(f"/v1/workflow-runs/{run['id']}", headers=tenant.headers)).json()["data"]
    assert failed["status"] == "FAILED", failed["status"]
    assert failed["error"]["code"] == "CONTEXT_EXPIRED"
    assert failed["error"]["details"]["toolCalls"][0]["id"] == call_id
    assert failed["requiredAction"] is None
    late = await client.post(
        f"/v1/workflow-runs/{run['id']}/tool-outputs",
        json={"toolOutputs": [{"toolCallId": call_id, "output": "sunny"}]},
        headers=tenant.headers,
    )
    assert late.status_code == 409

    # Retried, the step asks again and waits afresh: the closed call does not block it.
    retried = await client.post(f"/v1/workflow-runs/{run['id']}/retry", headers=tenant.headers)
    assert retried.status_code == 200, retried.text
    again = (await client.get(f"/v1/workflow-runs/{run['id']}?wait=10", headers=tenant.headers)).json()[
        "data"
    ]
    (new_call,) = again["requiredAction"]["toolCalls"]
    answered = await client.post(
        f"/v1/workflow-runs/{run['id']}/tool-outputs?wait=10",
        json={"toolOutputs": [{"toolCallId": new_call["id"], "output": "sunny"}]},
        headers=tenant.headers,
    )
    assert answered.json()["data"]["status"] == "COMPLETED", answered.text


async def test_a_shorter_timeout_fails_the_call_not_the_run(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    weather = {**WEATHER, "timeoutMs": 200, "outputsExpireAfterMs": 60_000}
    definition_id = await define([agent(weather)])
    created = await client.post(
        "/v1/workflow-runs?wait=10", json={"definitionId": definition_id}, headers=tenant.headers
    )
    run_id = created.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    done = (await client.get(f"/v1/workflow-runs/{run_id}", headers=tenant.headers)).json()["data"]
    assert done["status"] == "COMPLETED", done["error"]
    traces = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()
    assert traces["data"][0]["errorCode"] == "TOOL_OUTPUT_TIMEOUT"


async def test_expiry_is_for_client_tools(client: httpx.AsyncClient, tenant: Tenant) -> None:
    handler_tool = {**WEATHER, "execution": "handler", "outputsExpireAfterMs": 100}
    body = {"name": "x", "version": "1", "steps": [agent(handler_tool)]}
    response = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert response.status_code == 400
    assert "outputsExpireAfterMs applies to client tools only" in response.text


async def test_waiting_requests_share_the_pool_without_holding_connections(
    harness: Harness, app: Any, tenant: Tenant, define: DefinitionFactory
) -> None:
    """More waiting requests than the pool has connections all answer at their bound."""
    definition_id = await define([timer()])
    size = harness.rt.pool.get_max_size()
    async with make_client(app) as c:
        other = await bootstrap_tenant(c)
        assert other.workspace_id != tenant.workspace_id
        began = time.monotonic()
        answers = await asyncio.gather(
            *(
                c.post(
                    "/v1/workflow-runs?wait=1", json={"definitionId": definition_id}, headers=tenant.headers
                )
                for _ in range(size * 3)
            )
        )
        took = time.monotonic() - began
    assert all(a.status_code == 201 for a in answers)
    assert took < 8.0, took
