"""Inbound webhooks: a GitHub-signed delivery starts a run; forged or replayed ones start nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import httpx
import pytest
from api_helpers import Tenant

from stevora.settings import Settings

pytestmark = pytest.mark.timeout(60)

QUICK = [{"name": "pause", "type": "wait", "durationMs": 0}]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_hook_body_bytes": 4096})


def _sha256(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def _hook(client: httpx.AsyncClient, tenant: Tenant, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/hooks", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return dict(response.json()["data"])


async def _count(harness: Any, table: str, workspace_id: str) -> int:
    return int(
        await harness.rt.pool.fetchval(f"SELECT count(*) FROM {table} WHERE workspace_id = $1", workspace_id)
    )


async def test_a_github_signed_delivery_starts_a_run_and_a_replay_or_forgery_starts_nothing(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    definition = {
        "name": "review",
        "version": "1",
        "steps": QUICK,
        "triggers": [{"event": "github.pull_request"}],
    }
    assert (
        await client.post("/v1/workflow-definitions", json=definition, headers=tenant.headers)
    ).status_code == 201
    hook = await _hook(client, tenant, provider="github")
    assert hook["url"] == f"/hooks/{hook['id']}" and hook["secret"].startswith("hksec_")
    listed = await client.get("/v1/hooks", headers=tenant.headers)
    assert "secret" not in listed.text and listed.json()["data"][0]["id"] == hook["id"]
    body = json.dumps({"action": "opened", "number": 7}).encode()
    headers = {
        "content-type": "application/json",
        "x-github-event": "pull_request",
        "x-github-delivery": "d-1",
        "x-hub-signature-256": _sha256(hook["secret"], body),
    }
    first = await client.post(hook["url"], content=body, headers=headers)  # no API key
    assert first.status_code == 200, first.text
    data = first.json()["data"]
    assert data["name"] == "github.pull_request" and len(data["runs"]) == 1
    run = await harness.rt.pool.fetchrow(
        "SELECT input FROM workflow_runs WHERE id = $1", data["runs"][0]["runId"]
    )
    assert run["input"] == {"action": "opened", "number": 7}
    replay = await client.post(hook["url"], content=body, headers=headers)
    assert replay.status_code == 200 and replay.json()["data"]["deduplicated"] is True
    assert await _count(harness, "workflow_runs", tenant.workspace_id) == 1
    forged = await client.post(
        hook["url"],
        content=body.replace(b"7", b"8"),
        headers={**headers, "x-github-delivery": "d-2"},
    )
    assert forged.status_code == 401
    unsigned = await client.post(hook["url"], content=body, headers={"x-github-event": "push"})
    assert unsigned.status_code == 401
    assert await _count(harness, "trigger_events", tenant.workspace_id) == 1
    assert await _count(harness, "workflow_runs", tenant.workspace_id) == 1


async def test_stripe_signatures_carry_a_timestamp_within_the_tolerance(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    hook = await _hook(client, tenant, provider="stripe")
    body = json.dumps({"id": "evt_1", "type": "invoice.paid", "data": {"object": {}}}).encode()

    def signed(at: int) -> dict[str, str]:
        mac = hmac.new(hook["secret"].encode(), f"{at}.".encode() + body, hashlib.sha256).hexdigest()
        return {"stripe-signature": f"t={at},v1={mac}"}

    stale = await client.post(hook["url"], content=body, headers=signed(int(time.time()) - 3600))
    assert stale.status_code == 401
    fresh = await client.post(hook["url"], content=body, headers=signed(int(time.time())))
    assert fresh.status_code == 200 and fresh.json()["data"]["name"] == "stripe.invoice.paid"
    assert fresh.json()["data"]["id"] == f"hook:{hook['id']}:evt_1"


async def test_the_generic_form_needs_an_event_and_limits_the_body(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    missing = await client.post("/v1/hooks", json={"provider": "hmac"}, headers=tenant.headers)
    assert missing.status_code == 400 and "event" in missing.text
    hook = await _hook(client, tenant, provider="hmac", event="crm.lead")
    body = b'{"lead": "l1"}'
    ok = await client.post(
        hook["url"], content=body, headers={"x-signature-256": _sha256(hook["secret"], body)}
    )
    assert ok.status_code == 200 and ok.json()["data"]["name"] == "crm.lead"
    big = b'{"x": "' + b"a" * 5000 + b'"}'
    too_big = await client.post(
        hook["url"], content=big, headers={"x-signature-256": _sha256(hook["secret"], big)}
    )
    assert too_big.status_code == 413
    not_json = b"<xml/>"
    bad = await client.post(
        hook["url"], content=not_json, headers={"x-signature-256": _sha256(hook["secret"], not_json)}
    )
    assert bad.status_code == 400
    assert (await client.post("/hooks/hook_nope", content=body)).status_code == 404
    assert await _count(harness, "trigger_events", tenant.workspace_id) == 1
    deleted = await client.delete(f"/v1/hooks/{hook['id']}", headers=tenant.headers)
    assert deleted.status_code == 200
    assert (await client.post(hook["url"], content=body)).status_code == 404
