"""Workflows as tools over HTTP: a model calls a whole workflow, which runs as a child run whose
output (or failure) becomes the tool result; the parent waits durably, holding no worker."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from api_helpers import Tenant
from test_api_tool_outputs import start, wait_for

from stevora.ids import new_id
from stevora.tasks import StepResult
from tests.conftest import Harness
from tests.integration.loop.test_loop_basics import CONSISTENCY_SQL


async def define(client: httpx.AsyncClient, tenant: Tenant, body: dict[str, Any]) -> httpx.Response:
    return await client.post(
        "/v1/workflow-definitions", json={"version": "1.0.0", **body}, headers=tenant.headers
    )


async def defined(client: httpx.AsyncClient, tenant: Tenant, body: dict[str, Any]) -> str:
    response = await define(client, tenant, body)
    assert response.status_code == 201, response.text
    definition_id: str = response.json()["data"]["id"]
    return definition_id


def parent_body(name: str, *tools: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "steps": [
            {
                "type": "llm",
                "name": "agent",
                "model": "scripted",
                "messages": [{"role": "user", "content": "Research it"}],
                "tools": list(tools),
            }
        ],
    }


async def test_a_child_workflow_answers_the_call_with_its_output(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    seen: list[dict[str, Any]] = []

    async def research(ctx: Any) -> StepResult:
        seen.append(dict(ctx.workflow_input))
        return StepResult(state_updates={"summary": f"notes on {ctx.workflow_input['query']}"})

    harness.tasks.register("research", research)
    child = new_id("research")
    await defined(
        client,
        tenant,
        {
            "name": child,
            "description": "Research a topic on the web",
            "defaultParams": "query max_results=10 include_images=false temperature=0.7",
            "steps": [{"type": "task", "name": "search", "handler": "research"}],
        },
    )
    run_id = await start(
        client,
        tenant,
        await defined(client, tenant, parent_body(new_id("parent"), {"name": "research", "workflow": child})),
    )
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]

    # The model was offered the child's defaultParams as the tool's schema, and its description.
    offered = next(t for t in harness.scripted.requests[0].tools if t.name == "research")
    assert offered.description == "Research a topic on the web"
    assert offered.parameters["required"] == ["query"]
    assert offered.parameters["properties"]["max_results"] == {"type": "integer", "default": 10}

    # One child run, with the arguments (and the defaults) as input, linked both ways.
    children = (
        await client.get("/v1/workflow-runs", params={"parentRunId": run_id}, headers=tenant.headers)
    ).json()["data"]
    assert len(children) == 1
    kid = children[0]
    assert kid["status"] == "COMPLETED" and kid["parentRunId"] == run_id
    assert seen == [kid["input"]] and kid["input"]["query"] == "Research it"
    assert isinstance(kid["input"]["max_results"], int) and isinstance(kid["input"]["include_images"], bool)
    trace = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ][0]
    assert trace["childRunId"] == kid["id"] and trace["toolCallId"] == kid["parentToolCallId"]
    assert trace["status"] == "completed" and trace["outputJson"] == kid["output"]
    result = next(m for m in harness.scripted.requests[-1].messages if m.role == "tool")
    assert json.loads(result.content) == kid["output"]
    row = await harness.rt.pool.fetchrow(CONSISTENCY_SQL, run_id)
    assert row["events_without_trace"] == 0 and row["traces_without_one_event"] == 0
    paused = [e for e in await harness.events(run_id) if e["event_type"] == "WORKFLOW_PAUSED"]
    assert paused[0]["payload"]["reason"] == "child_runs"
    assert paused[0]["payload"]["childRuns"] == [{"toolCallId": trace["toolCallId"], "childRunId": kid["id"]}]


async def test_a_failed_child_gives_the_model_an_error_naming_the_child_run(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    async def broken(ctx: Any) -> StepResult:
        return StepResult(
            status="failed", error={"code": "NO_SOURCES", "message": "nothing found"}, retryable=False
        )

    harness.tasks.register("broken", broken)
    child = new_id("broken")
    await defined(
        client, tenant, {"name": child, "steps": [{"type": "task", "name": "search", "handler": "broken"}]}
    )
    run_id = await start(
        client,
        tenant,
        await defined(client, tenant, parent_body(new_id("parent"), {"name": "lookup", "workflow": child})),
    )
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED"
    kid = (
        await client.get("/v1/workflow-runs", params={"parentRunId": run_id}, headers=tenant.headers)
    ).json()["data"][0]
    assert kid["status"] == "FAILED"
    result = json.loads(next(m for m in harness.scripted.requests[-1].messages if m.role == "tool").content)
    assert result == {
        "error": f"Workflow '{child}' run {kid['id']} FAILED: NO_SOURCES: nothing found",
        "childRunId": kid["id"],
    }
    trace = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ][0]
    assert trace["status"] == "failed" and trace["errorCode"] == "CHILD_RUN_FAILED"


async def test_cancelling_the_parent_cancels_its_active_children(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    child = new_id("slow")
    await defined(
        client,
        tenant,
        {"name": child, "steps": [{"type": "external_event", "name": "hold", "signalType": "never"}]},
    )
    run_id = await start(
        client,
        tenant,
        await defined(
            client,
            tenant,
            parent_body(
                new_id("parent"), {"name": "one", "workflow": child}, {"name": "two", "workflow": child}
            ),
        ),
    )
    await wait_for(client, tenant, run_id, "WAITING")
    kids = []
    for _ in range(200):
        kids = (
            await client.get("/v1/workflow-runs", params={"parentRunId": run_id}, headers=tenant.headers)
        ).json()["data"]
        if len(kids) == 2 and all(k["status"] == "WAITING" for k in kids):
            break
        await asyncio.sleep(0.02)
    assert len(kids) == 2, "parallel workflow calls run as concurrent child runs"
    response = await client.post(f"/v1/workflow-runs/{run_id}/cancel", headers=tenant.headers)
    assert response.status_code == 200, response.text
    for kid in kids:
        assert (await wait_for(client, tenant, kid["id"], "CANCELLED"))["status"] == "CANCELLED"
    assert (await wait_for(client, tenant, run_id, "CANCELLED"))["status"] == "CANCELLED"
    # The parent was cancelled, not resumed: no tool result was written for the cancelled children.
    assert (
        await harness.rt.pool.fetchval("SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", run_id)
        == 0
    )


async def test_a_workflow_calling_itself_gets_an_error_result_and_creates_nothing(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    name = new_id("loop")
    run_id = await start(
        client, tenant, await defined(client, tenant, parent_body(name, {"name": "again", "workflow": name}))
    )
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED"
    assert (
        await client.get("/v1/workflow-runs", params={"parentRunId": run_id}, headers=tenant.headers)
    ).json()["data"] == []
    trace = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ][0]
    assert trace["errorCode"] == "WORKFLOW_RECURSION" and name in trace["error"]


async def test_the_depth_limit_stops_a_chain_with_an_error_result(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    harness.rt.settings = harness.rt.settings.model_copy(update={"max_workflow_depth": 2})
    leaf, middle = new_id("leaf"), new_id("middle")
    await defined(client, tenant, {"name": leaf, "steps": [{"type": "wait", "name": "w", "durationMs": 1}]})
    await defined(client, tenant, parent_body(middle, {"name": "leaf", "workflow": leaf}))
    run_id = await start(
        client,
        tenant,
        await defined(client, tenant, parent_body(new_id("root"), {"name": "middle", "workflow": middle})),
    )
    assert (await wait_for(client, tenant, run_id, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    kids = (
        await client.get("/v1/workflow-runs", params={"parentRunId": run_id}, headers=tenant.headers)
    ).json()["data"]
    assert len(kids) == 1 and kids[0]["status"] == "COMPLETED"
    grandkids = (
        await client.get("/v1/workflow-runs", params={"parentRunId": kids[0]["id"]}, headers=tenant.headers)
    ).json()["data"]
    assert grandkids == [], "depth 3 would exceed the limit of 2: nothing is created"
    trace = (
        await client.get(f"/v1/workflow-runs/{kids[0]['id']}/tool-traces", headers=tenant.headers)
    ).json()["data"][0]
    assert trace["errorCode"] == "WORKFLOW_DEPTH_EXCEEDED"


async def test_a_workflow_tool_naming_no_definition_is_refused_at_create_time(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await define(
        client, tenant, parent_body(new_id("p"), {"name": "ghost", "workflow": "no-such-workflow"})
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert error["details"]["errors"][0]["path"] == "steps[0].tools[0].workflow"


async def test_run_input_is_checked_against_the_input_schema_and_defaults_are_filled(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    definition_id = await defined(
        client,
        tenant,
        {
            "name": new_id("typed"),
            "inputSchema": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 3}},
                "required": ["city"],
            },
            "steps": [{"type": "wait", "name": "w", "durationMs": 1}],
        },
    )
    bad = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition_id, "input": {"city": 7}},
        headers=tenant.headers,
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["details"]["errors"][0]["path"] == "input.city"
    ok = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition_id, "input": {"city": "Lisbon"}},
        headers=tenant.headers,
    )
    assert ok.status_code == 201 and ok.json()["data"]["input"] == {"city": "Lisbon", "days": 3}
