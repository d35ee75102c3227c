"""Webhook limits (docs/api/webhooks.md, "Limits"): webhooks per workspace, and the cap on one
webhook's pending deliveries, past which an event's delivery is recorded FAILED (BACKLOG_FULL) and
never sent. Issue 29: a fuzzer made 221 endpoints and 55,597 queued deliveries in 12 minutes."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from api_helpers import DefinitionFactory, Tenant

from stevora.db.outbox import BACKLOG_FULL, BACKLOG_PER_WEBHOOK
from stevora.settings import Settings
from tests.conftest import Harness

LIMIT = 3
URL = "http://127.0.0.1:9/hook"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"webhook_allow_private": True, "webhooks_per_workspace": LIMIT})


async def create(
    client: httpx.AsyncClient, tenant: Tenant, events: list[str] | None = None
) -> httpx.Response:
    body = {"url": URL, "events": events or ["workflow.completed"]}
    return await client.post("/v1/webhooks", json=body, headers=tenant.headers)


async def test_a_workspace_has_at_most_its_limit_of_webhooks_even_when_created_at_once(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    answers = await asyncio.gather(*(create(client, tenant) for _ in range(LIMIT + 3)))
    assert sorted(r.status_code for r in answers) == [201] * LIMIT + [409] * 3
    refused = next(r for r in answers if r.status_code == 409).json()["error"]
    assert refused["code"] == "CONFLICT" and "STEVORA_WEBHOOKS_PER_WORKSPACE" in refused["message"]
    assert refused["details"] == {"limit": LIMIT, "webhooks": LIMIT}
    listed = await client.get("/v1/webhooks", headers=tenant.headers)
    assert len(listed.json()["data"]) == LIMIT
    # Another workspace has its own count; a deleted webhook frees a place.
    assert (await create(client, other_tenant)).status_code == 201
    first = listed.json()["data"][0]["id"]
    assert (await client.delete(f"/v1/webhooks/{first}", headers=tenant.headers)).status_code == 200
    assert (await create(client, tenant)).status_code == 201


async def test_past_its_backlog_a_webhooks_new_deliveries_are_failed_not_queued(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    full = (await create(client, tenant)).json()["data"]["id"]
    fresh = (await create(client, tenant)).json()["data"]["id"]
    # The full one's backlog, written as the outbox writes deliveries.
    await harness.rt.pool.execute(
        "INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event, payload, status, next_attempt_at) "
        "SELECT 'whd_fill' || g, $1, $2, 'workflow.completed', '{}'::jsonb, 'PENDING', now() + interval '1 hour' "
        "FROM generate_series(1, $3) g",
        full,
        tenant.workspace_id,
        BACKLOG_PER_WEBHOOK,
    )
    definition_id = await define([{"type": "wait", "name": "w", "durationMs": 1}])
    run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers)
    await harness.wait_for_status(run.json()["data"]["id"], "COMPLETED")

    async def deliveries(webhook_id: str, status: str) -> list[dict[str, object]]:
        page = await client.get(
            f"/v1/webhooks/{webhook_id}/deliveries", params={"status": status}, headers=tenant.headers
        )
        assert page.status_code == 200, page.text
        data: list[dict[str, object]] = page.json()["data"]
        return data

    (dropped,) = await deliveries(full, "FAILED")
    assert str(dropped["lastError"]).startswith(BACKLOG_FULL) and dropped["attempts"] == 0
    assert dropped["nextAttemptAt"] is None
    assert dropped["payload"]["data"]["workflowRunId"] == run.json()["data"]["id"]  # type: ignore[index]
    pending = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1 AND status = 'PENDING'", full
    )
    assert pending == BACKLOG_PER_WEBHOOK
    # The other webhook of the workspace is not held back by the full one.
    (queued,) = await deliveries(fresh, "PENDING")
    assert queued["lastError"] is None
