"""Webhook URLs that resolve to private, loopback or link-local addresses are refused, at creation
(400 naming `url`) and again at delivery (DNS can change), unless STEVORA_WEBHOOK_ALLOW_PRIVATE."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_helpers import Tenant, make_client

from stevora.api import create_app
from stevora.ids import new_id
from stevora.settings import Settings
from stevora.webhooks import deliver_due
from stevora.webhooks.address import is_public

PRIVATE_URLS = [
    "http://127.0.0.1:8080/hook",
    "http://localhost/hook",
    "http://10.1.2.3/hook",
    "http://192.168.0.10/hook",
    "http://172.16.5.4/hook",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    "http://[::1]/hook",
    "http://[fe80::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://0.0.0.0/hook",
    "http://100.64.0.1/hook",  # carrier-grade NAT
]


@pytest.mark.parametrize("url", PRIVATE_URLS)
async def test_private_webhook_url_is_refused_at_creation_naming_url(
    client: httpx.AsyncClient, tenant: Tenant, url: str
) -> None:
    response = await client.post(
        "/v1/webhooks", json={"url": url, "events": ["workflow.completed"]}, headers=tenant.headers
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert [e["path"] for e in error["details"]["errors"]] == ["url"]
    assert "private" in error["details"]["errors"][0]["message"]


async def test_public_address_is_accepted(client: httpx.AsyncClient, tenant: Tenant) -> None:
    for url in ("https://93.184.215.14/hook", "https://[2606:4700::1111]/hook"):
        response = await client.post(
            "/v1/webhooks", json={"url": url, "events": ["workflow.completed"]}, headers=tenant.headers
        )
        assert response.status_code == 201, response.text


def test_address_classification() -> None:
    assert is_public("8.8.8.8") and is_public("2001:4860:4860::8888")
    for private in (
        "127.0.0.1",
        "10.0.0.1",
        "169.254.1.1",
        "::1",
        "fe80::1%eth0",
        "::ffff:10.0.0.1",
        "fd00::1",
    ):
        assert not is_public(private), private


async def test_allow_private_setting_accepts_a_local_receiver(
    harness: Any, settings: Settings, tenant: Tenant
) -> None:
    allowed = settings.model_copy(update={"webhook_allow_private": True})
    async with make_client(create_app(allowed, runtime=harness.rt)) as client:
        response = await client.post(
            "/v1/webhooks",
            json={"url": "http://127.0.0.1:9/hook", "events": ["workflow.completed"]},
            headers=tenant.headers,
        )
    assert response.status_code == 201, response.text


async def test_delivery_to_a_private_address_is_refused_without_sending(harness: Any, tenant: Tenant) -> None:
    """A webhook stored while its name resolved publicly (here: written directly) is checked again."""
    hook_id, delivery_id = new_id("wh"), new_id("whd")
    await harness.rt.pool.execute(
        "INSERT INTO webhooks (id, workspace_id, url, events, secret) VALUES ($1, $2, $3, $4, 'whsec_x')",
        hook_id,
        tenant.workspace_id,
        "http://127.0.0.1:9/hook",
        ["workflow.completed"],
    )
    await harness.rt.pool.execute(
        "INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event, payload, next_attempt_at) "
        "VALUES ($1, $2, $3, 'workflow.completed', $4, now())",
        delivery_id,
        hook_id,
        tenant.workspace_id,
        {"event": "workflow.completed"},
    )
    assert not harness.rt.settings.webhook_allow_private
    assert await deliver_due(harness.rt) >= 1
    row = await harness.rt.pool.fetchrow("SELECT * FROM webhook_deliveries WHERE id = $1", delivery_id)
    assert row["attempts"] == 1 and row["last_status_code"] is None
    assert "private" in row["last_error"] and "127.0.0.1" in row["last_error"]
