"""Flow control over HTTP: a concurrency key validated at definition create (400 naming the field),
stored with the definition, rendered on the run and refused at run create when the input lacks it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from api_helpers import Tenant

from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness

_STEP = {"type": "task", "name": "t", "handler": "noop"}


async def test_a_key_naming_an_undeclared_or_non_input_path_is_a_400_at_definition_create(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    schema = {"type": "object", "properties": {"customerId": {"type": "string"}}}
    for key, message in [
        ("{{input.customer}}", "does not declare"),
        ("{{state.customerId}}", "may only read the run input"),
    ]:
        body = {
            "name": "wf",
            "version": "1",
            "steps": [_STEP],
            "inputSchema": schema,
            "concurrency": {"key": key, "limit": 1},
        }
        bad = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
        assert bad.status_code == 400, bad.text
        (problem,) = bad.json()["error"]["details"]["errors"]
        assert problem["path"] == "concurrency.key"
        assert message in problem["message"]


async def test_the_key_is_rendered_on_the_run_and_a_missing_field_is_a_400_storing_nothing(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    async def noop(ctx: Any) -> dict[str, Any]:
        return {"status": "completed"}

    harness.tasks.register("noop", noop)
    body = {
        "name": "wf",
        "version": "2",
        "steps": [_STEP],
        "concurrency": {"key": "cust-{{input.customerId}}", "limit": 2},
        "priority": 3,
    }
    created = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert created.status_code == 201, created.text
    assert created.json()["data"]["concurrency"] == {
        "key": "cust-{{input.customerId}}",
        "limit": 2,
        "holdWhileWaiting": True,
    }
    definition_id = created.json()["data"]["id"]

    run = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition_id, "input": {"customerId": "acme"}},
        headers=tenant.headers,
    )
    assert run.status_code == 201, run.text
    data = run.json()["data"]
    assert (data["concurrencyKey"], data["concurrencyLimit"], data["priority"]) == ("cust-acme", 2, 3)

    override = await client.post(
        "/v1/workflow-runs",
        json={
            "definitionId": definition_id,
            "input": {"customerId": "acme", "team": "x"},
            "concurrency": {"key": "{{input.team}}"},
            "priority": 7,
        },
        headers=tenant.headers,
    )
    assert override.status_code == 201, override.text
    data = override.json()["data"]
    assert (data["concurrencyKey"], data["concurrencyLimit"], data["priority"]) == ("x", 1, 7)

    before = await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs")
    missing = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id, "input": {}}, headers=tenant.headers
    )
    assert missing.status_code == 400, missing.text
    assert [p["path"] for p in missing.json()["error"]["details"]["errors"]] == ["input.customerId"]
    assert await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs") == before


async def test_a_queued_run_shows_its_key_and_position_in_the_api_and_the_ui(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    gate = asyncio.Event()

    async def hold(ctx: Any) -> dict[str, Any]:
        await gate.wait()
        return {"status": "completed"}

    harness.tasks.register("hold", hold)
    body = {
        "name": "wf",
        "version": "3",
        "steps": [{"type": "task", "name": "t", "handler": "hold"}],
        "concurrency": {"key": "{{input.customerId}}"},
    }
    created = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    definition_id = created.json()["data"]["id"]
    ids = []
    for _ in range(3):
        run = await client.post(
            "/v1/workflow-runs",
            json={"definitionId": definition_id, "input": {"customerId": "acme"}},
            headers=tenant.headers,
        )
        ids.append(run.json()["data"]["id"])
    last = ids[-1]
    for _ in range(250):
        detail = (await client.get(f"/v1/workflow-runs/{last}", headers=tenant.headers)).json()["data"]
        if detail["queuedAt"] is not None:
            break
        await asyncio.sleep(0.02)
    assert (detail["status"], detail["concurrencyKey"], detail["queuePosition"]) == ("PENDING", "acme", 2)

    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        page = await client.get(f"/ui/runs/{last}")
        listing = await client.get("/ui/runs")
    finally:
        client.cookies.delete(COOKIE_NAME)
    assert "position 2 in its queue" in page.text
    assert 'queued · <span class="mono">acme</span>' in listing.text
    gate.set()
    for run_id in ids:
        await harness.wait_for_status(run_id, "COMPLETED")
