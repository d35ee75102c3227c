"""The `…+fork-…` definition versions a fork or replay with another model derives are left out of
the Definitions page and the runs filter's dropdown (one per edit would crowd them); the page
says how many it left out, and the run still shows its own version."""

from __future__ import annotations

import httpx
from api_helpers import DefinitionFactory, Tenant

from stevora.db.forks import store_definition_version
from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness

STEPS = [{"type": "task", "name": "t", "handler": "noop"}]


async def test_derived_versions_are_hidden_from_lists_and_shown_on_their_run(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    harness.tasks.register("noop", lambda ctx: None)
    origin = await define(STEPS, name="support-agent")
    derived = await store_definition_version(harness.rt.pool, origin, "1.0.0+fork-0123456789ab", STEPS)
    run = await client.post("/v1/workflow-runs", json={"definitionId": derived}, headers=tenant.headers)
    run_id = run.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")

    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        definitions = (await client.get("/ui/definitions")).text
        runs = (await client.get("/ui/runs")).text
        run_page = (await client.get(f"/ui/runs/{run_id}")).text
    finally:
        client.cookies.delete(COOKIE_NAME)
    assert f"/ui/definitions/{origin}" in definitions and f'/ui/definitions/{derived}"' not in definitions
    assert "1 version derived by forks and replays" in definitions
    assert f'value="{origin}"' in runs and f'value="{derived}"' not in runs
    assert "1.0.0+fork-0123456789ab" in run_page
    # The API lists every version: it is the programmatic view.
    listed = (await client.get("/v1/workflow-definitions", headers=tenant.headers)).json()["data"]
    assert {d["id"] for d in listed} >= {origin, derived}
