"""Client-executed tools over HTTP: the run hands the model's calls to the API caller and waits,
durably, for `POST /v1/workflow-runs/{id}/tool-outputs` (issue: awaited tool calls)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from api_helpers import Conforms, DefinitionFactory, Tenant

from tests.conftest import Harness
from tests.integration.loop.test_loop_basics import CONSISTENCY_SQL

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city (runs in the caller's app)",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "execution": "client",
}
LOCATION = {
    "name": "get_location",
    "description": "The user's location (runs in the caller's browser)",
    "parameters": {"type": "object", "properties": {}},
    "execution": "client",
}


def agent(*tools: Any, **extra: Any) -> dict[str, Any]:
    return {
        "type": "llm",
        "name": "agent",
        "model": "scripted",
        "messages": [{"role": "user", "content": "What should I wear?"}],
        "tools": list(tools),
        **extra,
    }


async def wait_for(
    client: httpx.AsyncClient, tenant: Tenant, run_id: str, *statuses: str, timeout_s: float = 15.0
) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        response = await client.get(f"/v1/workflow-runs/{run_id}", headers=tenant.headers)
        run: dict[str, Any] = response.json()["data"]
        if run["status"] in statuses:
            return run
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"run {run_id} is {run['status']}, wanted {statuses}")
        await asyncio.sleep(0.02)


async def start(client: httpx.AsyncClient, tenant: Tenant, definition_id: str) -> str:
    response = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )
    assert response.status_code == 201, response.text
    run_id: str = response.json()["data"]["id"]
    return run_id


async def submit(
    client: httpx.AsyncClient, tenant: Tenant, run_id: str, *items: dict[str, Any]
) -> httpx.Response:
    return await client.post(
        f"/v1/workflow-runs/{run_id}/tool-outputs", json={"toolOutputs": list(items)}, headers=tenant.headers
    )


async def test_two_client_calls_answered_in_two_submissions_beside_a_handler_call(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness, conforms: Conforms
) -> None:
    ran: list[dict[str, Any]] = []

    async def packing_list(input: dict[str, Any]) -> list[str]:
        ran.append(input)
        return ["umbrella"]

    harness.tools.register(
        "packing_list",
        packing_list,
        parameters={"type": "object", "properties": {"trip": {"type": "string"}}},
    )
    run_id = await start(client, tenant, await define([agent(WEATHER, LOCATION, "packing_list")]))
    run = await wait_for(client, tenant, run_id, "WAITING")

    # The handler call of the round ran; the two client calls wait, in the model's order.
    assert len(ran) == 1
    action = run["requiredAction"]
    assert action["type"] == "submit_tool_outputs"
    assert [c["name"] for c in action["toolCalls"]] == ["get_weather", "get_location"]
    weather_id, location_id = (c["id"] for c in action["toolCalls"])
    assert isinstance(action["toolCalls"][0]["arguments"], dict)
    step = run["stepRuns"][-1]
    assert step["status"] == "WAITING" and run["nextRunAt"] is None
    paused = [e for e in await harness.events(run_id) if e["event_type"] == "WORKFLOW_PAUSED"]
    assert paused[-1]["payload"]["reason"] == "tool_outputs"
    assert [c["id"] for c in paused[-1]["payload"]["toolCalls"]] == [weather_id, location_id]

    # First submission answers one call: still WAITING, the other call remains.
    first = await submit(client, tenant, run_id, {"toolCallId": location_id, "output": {"city": "Lisbon"}})
    assert first.status_code == 200, first.text
    conforms(first, "post", "/v1/workflow-runs/{run_id}/tool-outputs")
    body = first.json()["data"]
    assert body["status"] == "WAITING"
    assert [c["id"] for c in body["requiredAction"]["toolCalls"]] == [weather_id]
    assert body["stepRuns"], "the answer is the run as GET returns it"

    # The last one resumes the run; the model gets both results, in its own order.
    second = await submit(client, tenant, run_id, {"toolCallId": weather_id, "output": "18°C, light rain"})
    assert second.status_code == 200, second.text
    done = await wait_for(client, tenant, run_id, "COMPLETED")
    assert done["requiredAction"] is None
    request = harness.scripted.requests[-1]
    results = [m for m in request.messages if m.role == "tool"]
    assert [r.tool_call_id for r in results] == [weather_id, location_id, results[2].tool_call_id]
    assert results[0].content == "18°C, light rain"
    assert json.loads(results[1].content) == {"city": "Lisbon"}
    assert len(ran) == 1, "the handler call is not run again when the step resumes"

    traces = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ]
    assert sorted(t["toolName"] for t in traces) == ["get_location", "get_weather", "packing_list"]
    assert {t["status"] for t in traces} == {"completed"}
    row = await harness.rt.pool.fetchrow(CONSISTENCY_SQL, run_id)
    assert row["events_without_trace"] == 0 and row["traces_without_one_event"] == 0
    completed = [e for e in await harness.events(run_id) if e["event_type"] == "TOOL_CALL_COMPLETED"]
    assert len(completed) == 3
    assert [e["sequence"] for e in await harness.events(run_id)] == list(
        range(1, len(await harness.events(run_id)) + 1)
    )


async def test_an_error_output_reaches_the_model_as_an_error_result(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    run_id = await start(client, tenant, await define([agent(LOCATION)]))
    run = await wait_for(client, tenant, run_id, "WAITING")
    call_id = run["requiredAction"]["toolCalls"][0]["id"]
    response = await submit(
        client, tenant, run_id, {"toolCallId": call_id, "error": "Location permission denied"}
    )
    assert response.status_code == 200, response.text
    await wait_for(client, tenant, run_id, "COMPLETED")
    result = next(m for m in harness.scripted.requests[-1].messages if m.role == "tool")
    assert json.loads(result.content) == {"error": "Location permission denied"}
    trace = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ][0]
    assert trace["status"] == "failed" and trace["error"] == "Location permission denied"
    assert [e["event_type"] for e in await harness.events(run_id)].count("TOOL_CALL_FAILED") == 1


async def test_identical_resubmission_is_200_even_after_the_run_resumed(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    run_id = await start(client, tenant, await define([agent(LOCATION)]))
    run = await wait_for(client, tenant, run_id, "WAITING")
    item = {"toolCallId": run["requiredAction"]["toolCalls"][0]["id"], "output": {"lat": 38.7}}
    assert (await submit(client, tenant, run_id, item)).status_code == 200
    await wait_for(client, tenant, run_id, "COMPLETED")
    again = await submit(client, tenant, run_id, item)
    assert again.status_code == 200, again.text
    assert again.json()["data"]["status"] == "COMPLETED"
    traces = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", run_id
    )
    assert traces == 1


async def test_each_bad_request_is_refused_with_its_code_and_records_nothing(
    client: httpx.AsyncClient,
    tenant: Tenant,
    other_tenant: Tenant,
    define: DefinitionFactory,
    harness: Harness,
) -> None:
    run_id = await start(client, tenant, await define([agent(WEATHER, LOCATION)]))
    run = await wait_for(client, tenant, run_id, "WAITING")
    weather_id, location_id = (c["id"] for c in run["requiredAction"]["toolCalls"])

    async def refused(
        expected_status: int, code: str, *items: dict[str, Any], who: Tenant = tenant
    ) -> dict[str, Any]:
        response = await submit(client, who, run_id, *items)
        assert response.status_code == expected_status, response.text
        error: dict[str, Any] = response.json()["error"]
        assert error["code"] == code
        return error

    # One bad item makes the whole request fail: the good item before it is not recorded either.
    error = await refused(
        400,
        "INVALID_TOOL_OUTPUTS",
        {"toolCallId": weather_id, "output": 1},
        {"toolCallId": "call_nope", "output": 2},
    )
    assert "call_nope" in error["message"]
    big = "x" * (harness.rt.settings.max_tool_output_bytes + 1)
    error = await refused(400, "TOOL_OUTPUT_TOO_LARGE", {"toolCallId": weather_id, "output": big})
    assert weather_id in error["message"]
    await refused(400, "VALIDATION_ERROR", {"toolCallId": weather_id})
    await refused(400, "VALIDATION_ERROR", {"toolCallId": weather_id, "output": 1, "error": "both"})
    await refused(
        400,
        "INVALID_TOOL_OUTPUTS",
        {"toolCallId": weather_id, "output": 1},
        {"toolCallId": weather_id, "output": 1},
    )
    await refused(404, "NOT_FOUND", {"toolCallId": weather_id, "output": 1}, who=other_tenant)
    assert (
        await harness.rt.pool.fetchval("SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", run_id)
        == 0
    )

    # Answered once; a different value for the same call is refused, naming it.
    assert (
        await submit(client, tenant, run_id, {"toolCallId": weather_id, "output": "sunny"})
    ).status_code == 200
    error = await refused(400, "INVALID_TOOL_OUTPUTS", {"toolCallId": weather_id, "output": "rain"})
    assert weather_id in error["message"]

    # Once nothing is pending any more, a new output is an invalid state transition.
    assert (
        await submit(client, tenant, run_id, {"toolCallId": location_id, "output": "here"})
    ).status_code == 200
    await wait_for(client, tenant, run_id, "COMPLETED")
    await refused(409, "INVALID_STATE_TRANSITION", {"toolCallId": "call_other", "output": 1})


async def test_a_run_not_waiting_for_tool_outputs_answers_409(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory
) -> None:
    definition = await define([{"type": "external_event", "name": "wait", "signalType": "go"}])
    run_id = await start(client, tenant, definition)
    await wait_for(client, tenant, run_id, "WAITING")
    response = await submit(client, tenant, run_id, {"toolCallId": "call_1", "output": 1})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "INVALID_STATE_TRANSITION"


async def test_concurrent_submissions_for_one_call_record_it_once(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    run_id = await start(client, tenant, await define([agent(WEATHER, LOCATION)]))
    run = await wait_for(client, tenant, run_id, "WAITING")
    weather_id = run["requiredAction"]["toolCalls"][0]["id"]
    responses = await asyncio.gather(
        *(
            submit(client, tenant, run_id, {"toolCallId": weather_id, "output": f"answer {i}"})
            for i in range(8)
        )
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 1 and statuses.count(400) == 7, statuses
    assert (
        await harness.rt.pool.fetchval("SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", run_id)
        == 1
    )
    events = [e["event_type"] for e in await harness.events(run_id)]
    assert events.count("TOOL_CALL_COMPLETED") == 1


async def test_a_client_call_that_times_out_fails_with_tool_output_timeout_and_the_loop_goes_on(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    run_id = await start(client, tenant, await define([agent({**WEATHER, "timeoutMs": 300}, LOCATION)]))
    run = await wait_for(client, tenant, run_id, "WAITING")
    weather_id, location_id = (c["id"] for c in run["requiredAction"]["toolCalls"])
    assert run["nextRunAt"] is not None, "a timed call wakes the run when it is due"
    # The timed call expires on its own; the run keeps waiting for the other one.
    await asyncio.sleep(0.6)
    run = await wait_for(client, tenant, run_id, "WAITING")
    assert [c["id"] for c in run["requiredAction"]["toolCalls"]] == [location_id]
    trace = await harness.rt.pool.fetchrow(
        "SELECT status, error_code FROM tool_trace WHERE workflow_run_id = $1 AND tool_call_id = $2",
        run_id,
        weather_id,
    )
    assert trace["status"] == "failed" and trace["error_code"] == "TOOL_OUTPUT_TIMEOUT"
    assert (
        await submit(client, tenant, run_id, {"toolCallId": location_id, "output": "Lisbon"})
    ).status_code == 200
    await wait_for(client, tenant, run_id, "COMPLETED")
    result = next(m for m in harness.scripted.requests[-1].messages if m.role == "tool")
    assert "No output was submitted" in json.loads(result.content)["error"]


async def test_waiting_for_tool_outputs_announces_a_webhook_with_the_calls(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    await harness.rt.pool.execute(
        "INSERT INTO webhooks (id, workspace_id, url, events, secret) VALUES ($1, $2, $3, $4, 'whsec_test')",
        "wh_tooloutputs",
        tenant.workspace_id,
        "https://hooks.example.com/stevora",
        ["workflow.tool_outputs_required"],
    )
    run_id = await start(client, tenant, await define([agent(WEATHER, LOCATION)]))
    run = await wait_for(client, tenant, run_id, "WAITING")
    deliveries = await harness.rt.pool.fetch(
        "SELECT event, payload FROM webhook_deliveries WHERE webhook_id = 'wh_tooloutputs'"
    )
    assert [d["event"] for d in deliveries] == ["workflow.tool_outputs_required"]
    data = deliveries[0]["payload"]["data"]
    assert data == {
        "workflowRunId": run_id,
        "status": "WAITING",
        "toolCalls": run["requiredAction"]["toolCalls"],
    }
