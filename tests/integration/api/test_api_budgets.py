"""Budgets over HTTP: a run's budget at create (within the server's maximum), the
`POST /workflow-runs/{id}/budget` raise that resumes a paused run, `tool` steps, and `/metrics`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_helpers import Conforms, DefinitionFactory, Tenant
from prometheus_client.parser import text_string_to_metric_families
from test_api_tool_outputs import wait_for

from tests.conftest import Harness


def _agent(rounds: int = 5) -> dict[str, Any]:
    """A scripted model that calls `lookup` once in each of `rounds` rounds, then answers."""
    return {
        "type": "llm",
        "name": "agent",
        "model": f"scripted:rounds={rounds}",
        "maxToolRounds": rounds,
        "messages": [{"role": "user", "content": "Look things up"}],
        "tools": ["lookup"],
    }


def _lookup(harness: Harness) -> list[int]:
    ran: list[int] = []

    @harness.tools.tool
    async def lookup() -> str:
        """Look something up."""
        ran.append(1)
        return "found"

    return ran


@pytest.fixture
def ceiling(harness: Harness) -> Iterator[None]:
    """The server's maximum: 10 model calls, 4 tool calls, no cost ceiling."""
    original = harness.rt.settings
    harness.rt.settings = original.model_copy(update={"max_run_model_calls": 10, "max_run_tool_calls": 4})
    yield
    harness.rt.settings = original


async def _create(
    client: httpx.AsyncClient, tenant: Tenant, definition_id: str, **body: Any
) -> httpx.Response:
    return await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id, **body}, headers=tenant.headers
    )


async def _run_count(harness: Harness, tenant: Tenant) -> int:
    count: int = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1", tenant.workspace_id
    )
    return count


async def test_a_budget_above_the_server_maximum_is_a_400_naming_the_field_and_stores_nothing(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness, ceiling: None
) -> None:
    _lookup(harness)
    definition_id = await define([_agent()])
    response = await _create(client, tenant, definition_id, budget={"maxToolCalls": 5, "maxModelCalls": 10})

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert [p["path"] for p in error["details"]["errors"]] == ["budget.maxToolCalls"]
    assert "above this server's maximum of 4" in error["details"]["errors"][0]["message"]
    assert await _run_count(harness, tenant) == 0


@pytest.mark.parametrize(
    ("budget", "path"),
    [
        ({"maxToolCalls": -1}, "budget.maxToolCalls"),
        ({"maxModelCalls": 1.5}, "budget.maxModelCalls"),
        ({"maxCostCents": "lots"}, "budget.maxCostCents"),
        ({"onBudgetExceeded": "explode"}, "budget.onBudgetExceeded"),
        ({"maxToolCall": 3}, "budget.maxToolCall"),
    ],
)
async def test_a_malformed_budget_at_create_is_a_400_naming_the_field(
    client: httpx.AsyncClient,
    tenant: Tenant,
    define: DefinitionFactory,
    harness: Harness,
    budget: dict[str, Any],
    path: str,
) -> None:
    definition_id = await define([_agent()])
    response = await _create(client, tenant, definition_id, budget=budget)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["details"]["errors"][0]["path"] == path
    assert await _run_count(harness, tenant) == 0


async def test_a_definition_budget_is_validated_and_stored_with_the_definition(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    body = {
        "name": "wf",
        "version": "1",
        "steps": [_agent()],
        "budget": {"maxCostCents": -5, "maxToolCall": 3},
    }
    bad = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert bad.status_code == 400
    problems = {p["path"]: p["message"] for p in bad.json()["error"]["details"]["errors"]}
    assert set(problems) == {"budget.maxCostCents", "budget.maxToolCall"}
    assert "did you mean 'maxToolCalls'" in problems["budget.maxToolCall"]

    body["budget"] = {"maxCostCents": 150, "onBudgetExceeded": "pause"}
    good = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert good.status_code == 201, good.text
    assert good.json()["data"]["budget"] == {"maxCostCents": 150.0, "onBudgetExceeded": "pause"}


async def test_the_server_maximum_is_the_default_and_lowers_a_definition_default_above_it(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness, ceiling: None
) -> None:
    plain = await define([_agent()])
    response = await _create(client, tenant, plain)
    assert response.status_code == 201, response.text
    assert response.json()["data"]["budget"] == {
        "maxModelCalls": 10,
        "maxToolCalls": 4,
        "onBudgetExceeded": "fail",
    }
    body = {"name": "generous", "version": "1", "steps": [_agent()], "budget": {"maxToolCalls": 50}}
    created = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    response = await _create(client, tenant, created.json()["data"]["id"])
    assert response.status_code == 201, response.text
    assert response.json()["data"]["budget"]["maxToolCalls"] == 4


async def test_a_paused_run_shows_its_budget_and_a_raise_through_the_api_resumes_it_to_completion(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness, conforms: Conforms
) -> None:
    ran = _lookup(harness)
    definition_id = await define([_agent(rounds=5)])
    created = await _create(
        client, tenant, definition_id, budget={"maxToolCalls": 2, "onBudgetExceeded": "pause"}
    )
    assert created.status_code == 201, created.text
    run_id = created.json()["data"]["id"]
    run = await wait_for(client, tenant, run_id, "WAITING", "FAILED", "COMPLETED")
    assert run["status"] == "WAITING" and len(ran) == 2
    assert run["budget"] == {"maxToolCalls": 2, "onBudgetExceeded": "pause"}
    assert run["budgetUsed"] == {"costCents": 0.0, "modelCalls": 3, "toolCalls": 2}
    assert run["stepRuns"][-1]["signalType"] == "budget"

    raised = await client.post(
        f"/v1/workflow-runs/{run_id}/budget", json={"maxToolCalls": 10}, headers=tenant.headers
    )
    assert raised.status_code == 200, raised.text
    conforms(raised, "post", "/v1/workflow-runs/{run_id}/budget")
    assert raised.json()["data"]["budget"] == {"maxToolCalls": 10, "onBudgetExceeded": "pause"}
    run = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert run["status"] == "COMPLETED", run["error"]
    assert len(ran) == 5 and run["budgetUsed"]["toolCalls"] == 5

    events = await client.get(f"/v1/workflow-runs/{run_id}/events", headers=tenant.headers)
    by_type = [(e["eventType"], e["payload"]) for e in events.json()["data"]]
    updated = [p for t, p in by_type if t == "BUDGET_UPDATED"]
    assert updated == [
        {
            "budget": {"maxToolCalls": 10, "onBudgetExceeded": "pause"},
            "previous": {"maxToolCalls": 2, "onBudgetExceeded": "pause"},
        }
    ]
    assert [p["reason"] for t, p in by_type if t == "WORKFLOW_RESUMED"] == ["budget"]

    # Finished: the budget no longer changes.
    late = await client.post(
        f"/v1/workflow-runs/{run_id}/budget", json={"maxToolCalls": 20}, headers=tenant.headers
    )
    assert late.status_code == 409 and late.json()["error"]["code"] == "INVALID_STATE_TRANSITION"


async def test_a_raise_above_the_server_maximum_is_a_400_and_changes_nothing(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness, ceiling: None
) -> None:
    _lookup(harness)
    definition_id = await define([_agent(rounds=5)])
    created = await _create(
        client, tenant, definition_id, budget={"maxToolCalls": 2, "onBudgetExceeded": "pause"}
    )
    run_id = created.json()["data"]["id"]
    await wait_for(client, tenant, run_id, "WAITING")
    response = await client.post(
        f"/v1/workflow-runs/{run_id}/budget", json={"maxToolCalls": 5}, headers=tenant.headers
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"]["errors"][0]["path"] == "maxToolCalls"
    run = await wait_for(client, tenant, run_id, "WAITING")
    assert run["budget"]["maxToolCalls"] == 2


async def test_another_workspaces_run_budget_is_not_found(
    client: httpx.AsyncClient,
    tenant: Tenant,
    other_tenant: Tenant,
    define: DefinitionFactory,
    harness: Harness,
) -> None:
    _lookup(harness)
    definition_id = await define([_agent(rounds=1)])
    run_id = (await _create(client, tenant, definition_id)).json()["data"]["id"]
    response = await client.post(
        f"/v1/workflow-runs/{run_id}/budget", json={"maxToolCalls": 5}, headers=other_tenant.headers
    )
    assert response.status_code == 404


async def test_a_tool_step_over_max_tool_calls_fails_with_budget_exceeded_and_metrics_count_it(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    ran = _lookup(harness)
    definition_id = await define(
        [
            {"type": "tool", "name": "first", "tool": "lookup", "input": {}},
            {"type": "tool", "name": "second", "tool": "lookup", "input": {}},
        ]
    )
    before = await _budget_stops(client)
    run_id = (await _create(client, tenant, definition_id, budget={"maxToolCalls": 1})).json()["data"]["id"]
    run = await wait_for(client, tenant, run_id, "FAILED", "COMPLETED")

    assert run["status"] == "FAILED" and len(ran) == 1
    assert run["error"]["code"] == "BUDGET_EXCEEDED" and run["error"]["stepName"] == "second"
    assert run["error"]["details"]["limit"] == "maxToolCalls"
    after = await _budget_stops(client)
    assert after - before == 1


async def _budget_stops(client: httpx.AsyncClient) -> float:
    response = await client.get("/metrics")
    return sum(
        sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "stevora_budget_stops_total"
        and sample.labels == {"limit": "tool_calls", "action": "fail"}
    )


async def test_a_tool_step_over_budget_in_pause_mode_waits_and_runs_after_a_raise(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    ran = _lookup(harness)
    definition_id = await define(
        [
            {"type": "tool", "name": "first", "tool": "lookup", "input": {}},
            {"type": "tool", "name": "second", "tool": "lookup", "input": {}},
        ]
    )
    budget = {"maxToolCalls": 1, "onBudgetExceeded": "pause"}
    run_id = (await _create(client, tenant, definition_id, budget=budget)).json()["data"]["id"]
    run = await wait_for(client, tenant, run_id, "WAITING", "FAILED", "COMPLETED")
    assert run["status"] == "WAITING" and len(ran) == 1
    assert [(s["stepName"], s["status"], s["signalType"]) for s in run["stepRuns"]] == [
        ("first", "COMPLETED", None),
        ("second", "WAITING", "budget"),
    ]
    raised = await client.post(
        f"/v1/workflow-runs/{run_id}/budget", json={"maxToolCalls": 2}, headers=tenant.headers
    )
    assert raised.status_code == 200, raised.text
    run = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert run["status"] == "COMPLETED" and len(ran) == 2
