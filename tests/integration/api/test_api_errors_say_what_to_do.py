"""Errors a new user meets name what to do next: the missing handler's registration call and
`--tools`, the UI's retry that would fail the same way, the status of a run that cannot be paused
or resumed."""

from __future__ import annotations

import httpx
from api_helpers import DefinitionFactory, Tenant

from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness


async def _run(client: httpx.AsyncClient, tenant: Tenant, definition_id: str) -> str:
    created = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )
    assert created.status_code == 201, created.text
    run_id: str = created.json()["data"]["id"]
    return run_id


async def test_an_unregistered_handler_names_register_task_handler_and_tools_and_the_ui_says_retry_fails(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    definition_id = await define([{"type": "task", "name": "greet", "handler": "greet_nobody_registered"}])
    run_id = await _run(client, tenant, definition_id)
    await harness.wait_for_status(run_id, "FAILED")
    run = (await client.get(f"/v1/workflow-runs/{run_id}", headers=tenant.headers)).json()["data"]
    assert run["error"]["code"] == "HANDLER_NOT_REGISTERED"
    message = run["error"]["message"]
    assert "register_task_handler('greet_nobody_registered', fn)" in message
    assert "--tools" in message

    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        page = (await client.get(f"/ui/runs/{run_id}")).text
    finally:
        client.cookies.delete(COOKIE_NAME)
    assert "data-retry-note" in page and "Retrying fails the same way" in page


async def test_pause_of_a_waiting_run_and_resume_of_a_cancelled_one_say_its_status(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    definition_id = await define([{"type": "wait", "name": "w", "durationMs": 60_000}])
    run_id = await _run(client, tenant, definition_id)
    await harness.wait_for_status(run_id, "WAITING")
    base = f"/v1/workflow-runs/{run_id}"
    paused = await client.post(f"{base}/pause", headers=tenant.headers)
    assert paused.status_code == 409
    assert "this run is WAITING" in paused.json()["error"]["message"]
    assert paused.json()["error"]["details"]["status"] == "WAITING"

    assert (await client.post(f"{base}/cancel", headers=tenant.headers)).status_code == 200
    resumed = await client.post(f"{base}/resume", headers=tenant.headers)
    assert resumed.status_code == 409
    error = resumed.json()["error"]
    assert "CANCELLED" in error["message"] and "has ended" in error["message"]
    assert "signalType" not in error["message"]
