"""Dagu's forms (issue 22): a bare name in `tools` that is no registered tool calls the stored
workflow of that name; a registered tool of the same name wins; the run page's tool panel shows a
workflow tool with the schema and description the model received."""

from __future__ import annotations

from typing import Any

import httpx
from api_helpers import Tenant
from test_api_tool_outputs import start, wait_for
from test_api_workflow_tools import defined, parent_body

from stevora.ids import new_id
from stevora.tasks import StepResult
from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness

CALCULATOR = {
    "description": "Do arithmetic on two numbers",
    "defaultParams": "operation a b precision=2",
    "steps": [{"type": "task", "name": "compute", "handler": "compute"}],
}


def register_compute(harness: Harness, seen: list[dict[str, Any]]) -> None:
    async def compute(ctx: Any) -> StepResult:
        seen.append(dict(ctx.workflow_input))
        return StepResult(state_updates={"result": 42})

    harness.tasks.register("compute", compute)


async def test_a_bare_name_calls_the_stored_workflow_of_that_name(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    """Fails where `tools: ["calculator"]` naming a workflow is TOOL_NOT_REGISTERED."""
    seen: list[dict[str, Any]] = []
    register_compute(harness, seen)
    name = new_id("calculator")
    await defined(client, tenant, {"name": name, **CALCULATOR})
    step = {**parent_body("x")["steps"][0], "tools": [name]}
    run_id = await start(
        client, tenant, await defined(client, tenant, {"name": new_id("p"), "steps": [step]})
    )
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]

    offered = next(t for t in harness.scripted.requests[0].tools if t.name == name)
    assert offered.description == "Do arithmetic on two numbers"
    assert offered.parameters["required"] == ["operation", "a", "b"]
    assert offered.parameters["properties"]["precision"] == {"type": "integer", "default": 2}
    (kid,) = (
        await client.get("/v1/workflow-runs", params={"parentRunId": run_id}, headers=tenant.headers)
    ).json()["data"]
    assert kid["status"] == "COMPLETED" and seen == [kid["input"]]
    (trace,) = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ]
    assert trace["toolName"] == name and trace["childRunId"] == kid["id"]

    # The run page's tool panel shows what the model received, not "schema is not known".
    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        page = await client.get(f"/ui/runs/{run_id}")
    finally:
        client.cookies.delete(COOKIE_NAME)
    assert page.status_code == 200
    panel = page.text[page.text.index("tools-panel") :]
    assert "schema is not known" not in panel
    assert "Do arithmetic on two numbers" in panel
    assert "precision" in panel and "operation" in panel


async def test_the_tool_panel_shows_a_workflow_tools_derived_schema(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    """Fails where the panel shows `calculator ()` and "schema is not known"."""
    register_compute(harness, [])
    name = new_id("calculator")
    await defined(client, tenant, {"name": name, **CALCULATOR})
    step = {**parent_body("x")["steps"][0], "tools": [{"name": "calculator", "workflow": name}]}
    run_id = await start(
        client, tenant, await defined(client, tenant, {"name": new_id("p"), "steps": [step]})
    )
    await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        page = await client.get(f"/ui/runs/{run_id}")
    finally:
        client.cookies.delete(COOKIE_NAME)
    panel = page.text[page.text.index("tools-panel") :]
    assert "schema is not known" not in panel
    assert "Do arithmetic on two numbers" in panel
    signature = panel[panel.index("tool-sig") : panel.index("</div>", panel.index("tool-sig"))]
    assert "operation" in signature and "precision?" in signature


async def test_a_registered_tool_wins_over_a_workflow_of_the_same_name(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    seen: list[dict[str, Any]] = []
    register_compute(harness, seen)
    name = new_id("calc")
    await defined(client, tenant, {"name": name, **CALCULATOR})
    harness.tools.register(name, lambda input: "from the handler", description="The registered one")
    step = {**parent_body("x")["steps"][0], "tools": [name]}
    run_id = await start(
        client, tenant, await defined(client, tenant, {"name": new_id("p"), "steps": [step]})
    )
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]
    assert seen == []  # the workflow never ran
    (trace,) = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ]
    assert trace["outputJson"] == "from the handler" and trace["childRunId"] is None


async def test_a_bare_name_that_is_neither_fails_naming_both_places(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    step = {**parent_body("x")["steps"][0], "tools": ["nowhere_to_be_found"]}
    run_id = await start(
        client, tenant, await defined(client, tenant, {"name": new_id("p"), "steps": [step]})
    )
    failed = await wait_for(client, tenant, run_id, "FAILED")
    assert failed["error"]["code"] == "TOOL_NOT_REGISTERED"
    assert "nor a workflow of this workspace" in failed["error"]["message"]
