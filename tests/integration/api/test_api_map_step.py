"""The `map` step over HTTP: validated at definition create (400 naming the field), its progress in
`GET /v1/workflow-runs/{id}` (each map step run's `map`), on the run page (counts, items, child
links; the child's page names its item) and in the CLI's rendering of the run and its events."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from api_helpers import Tenant
from rich.console import Console

from stevora.cli.render import Progress, steps_table
from stevora.client import Event, WorkflowRun
from stevora.ids import new_id
from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness


async def _define(client: httpx.AsyncClient, tenant: Tenant, body: dict[str, Any]) -> httpx.Response:
    return await client.post(
        "/v1/workflow-definitions", json={"version": "1", **body}, headers=tenant.headers
    )


def _map(**fields: Any) -> dict[str, Any]:
    return {"type": "map", "name": "fan", "items": "{{input.items}}", "workflow": "child", **fields}


async def test_a_map_step_is_validated_at_definition_create(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    unknown = await _define(client, tenant, {"name": new_id("p"), "steps": [_map(workflow="nope")]})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["details"]["errors"] == [
        {
            "path": "steps[0].workflow",
            "message": "Workflow definition 'nope' does not exist in this workspace",
        }
    ]
    bad = await _define(
        client,
        tenant,
        {"name": new_id("p"), "steps": [_map(concurrency=0, items="tickets", onItemFailure="skip")]},
    )
    assert bad.status_code == 400
    paths = {p["path"] for p in bad.json()["error"]["details"]["errors"]}
    assert paths == {"steps[0].concurrency", "steps[0].items", "steps[0].onItemFailure"}


async def test_progress_shows_in_the_api_the_ui_and_the_cli(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    gate = asyncio.Event()

    async def work(ctx: Any) -> dict[str, Any]:
        if ctx.workflow_input["item"] != "first":
            await gate.wait()
        if ctx.workflow_input["item"] == "bad":
            return {"status": "failed", "error": {"code": "NOPE", "message": "no"}, "retryable": False}
        return {"status": "completed", "stateUpdates": {"seen": ctx.workflow_input["item"]}}

    harness.tasks.register("work", work)
    child = new_id("child")
    made = await _define(
        client, tenant, {"name": child, "steps": [{"type": "task", "name": "w", "handler": "work"}]}
    )
    assert made.status_code == 201, made.text
    parent = await _define(
        client,
        tenant,
        {"name": new_id("parent"), "steps": [_map(workflow=child, concurrency=2, onItemFailure="continue")]},
    )
    assert parent.status_code == 201, parent.text
    started = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": parent.json()["data"]["id"], "input": {"items": ["first", "bad", "third"]}},
        headers=tenant.headers,
    )
    run_id = started.json()["data"]["id"]

    for _ in range(250):
        detail = (await client.get(f"/v1/workflow-runs/{run_id}", headers=tenant.headers)).json()["data"]
        fanout = detail["stepRuns"][0]["map"] if detail["stepRuns"] else None
        if fanout and fanout["done"] == 1 and fanout["running"] == 2:
            break
        await asyncio.sleep(0.02)
    assert detail["status"] == "WAITING"
    assert fanout == {
        "total": 3,
        "done": 1,
        "completed": 1,
        "failed": 0,
        "running": 2,
        "concurrency": 2,
        "onItemFailure": "continue",
    }
    # The CLI's `runs show` table and `--watch` lines.
    console = Console(width=200, record=True)
    console.print(steps_table(WorkflowRun.model_validate(detail)))
    assert "1/3 done · 2 running" in console.export_text()

    client.cookies.set(COOKIE_NAME, tenant.key)
    page = (await client.get(f"/ui/runs/{run_id}")).text
    assert "1 of 3</strong> done · 2 running" in page
    children = {
        c["input"]["item"]: c["id"]
        for c in (await client.get(f"/v1/workflow-runs?parentRunId={run_id}", headers=tenant.headers)).json()[
            "data"
        ]
    }
    assert set(children) == {"first", "bad", "third"}
    for child_id in children.values():
        assert f'href="/ui/runs/{child_id}"' in page
    child_page = (await client.get(f"/ui/runs/{children['bad']}")).text
    assert "for item 1 of 3 of its <code>map</code> step <strong>fan</strong>" in child_page

    gate.set()
    for _ in range(250):
        detail = (await client.get(f"/v1/workflow-runs/{run_id}", headers=tenant.headers)).json()["data"]
        if detail["status"] == "COMPLETED":
            break
        await asyncio.sleep(0.02)
    assert detail["status"] == "COMPLETED"
    assert detail["stepRuns"][0]["map"]["done"] == 3 and detail["stepRuns"][0]["map"]["failed"] == 1
    assert [r["status"] for r in detail["output"]["fan"]] == ["COMPLETED", "FAILED", "COMPLETED"]
    page = (await client.get(f"/ui/runs/{run_id}")).text
    assert "3 of 3</strong> done · 0 running" in page and "1 failed" in page and "NOPE" in page

    events = (await client.get(f"/v1/workflow-runs/{run_id}/events", headers=tenant.headers)).json()["data"]
    progress = Progress()
    lines = [progress.line(Event.model_validate(e)) for e in events]
    text = "\n".join(line for line in lines if line)
    assert "mapping 3 item(s)" in text and "2 at a time" in text
    assert "fan[1] [red]failed[/red]" in text and "3/3 done · 0 running · 1 failed" in text
