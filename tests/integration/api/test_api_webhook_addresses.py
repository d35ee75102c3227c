"""Webhook URLs that resolve to private, loopback or link-local addresses are refused, at creation
(400 naming `url`) and again at delivery (DNS can change), unless STEVORA_WEBHOOK_ALLOW_PRIVATE."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
from api_helpers import Tenant, make_client

import stevora.webhooks.address as address_module
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
    # IPv6 forms that carry a private IPv4 address, or are not global (issue 18)
    "http://[64:ff9b::7f00:1]/hook",  # NAT64 of 127.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of the cloud metadata address
    "http://[64:ff9b:1::808:808]/hook",  # local-use NAT64
    "http://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
    "http://[2002:a00:1::1]/hook",  # 6to4 of 10.0.0.1
    "http://[::127.0.0.1]/hook",  # IPv4-compatible
    "http://[::8.8.8.8]/hook",  # IPv4-compatible (deprecated; never delivered to)
    "http://[::ffff:169.254.169.254]/hook",  # IPv4-mapped metadata
    "http://[2001::1]/hook",  # Teredo
    "http://[fec0::1]/hook",  # site-local
    "http://[fd12:3456::1]/hook",  # unique local
    "http://[ff02::1]/hook",  # multicast
    "http://[::]/hook",  # unspecified
    "http://[2001:db8::1]/hook",  # documentation
    "http://[3fff::1]/hook",  # documentation (RFC 9637)
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
    for url in (
        "https://93.184.215.14/hook",
        "https://[2606:4700::1111]/hook",
        "https://[64:ff9b::808:808]/hook",  # NAT64 of a public address
        "https://[2002:808:808::1]/hook",  # 6to4 of a public address
        "https://[::ffff:8.8.8.8]/hook",
    ):
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
        "64:ff9b::7f00:1",
        "2002:7f00:1::",
        "::127.0.0.1",
        "fec0::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "ff0e::1",
        "224.0.0.1",
        "255.255.255.255",
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


@pytest.mark.parametrize("url", ["http://hooks.example:99999/x", "http://hooks.example:0/x", "http://h:-1/x"])
async def test_a_webhook_url_with_a_port_outside_1_to_65535_is_a_400_naming_url(
    client: httpx.AsyncClient, tenant: Tenant, url: str
) -> None:
    response = await client.post(
        "/v1/webhooks", json={"url": url, "events": ["workflow.completed"]}, headers=tenant.headers
    )
    assert response.status_code == 400, response.text
    errors = response.json()["error"]["details"]["errors"]
    assert [e["path"] for e in errors] == ["url"] and "port" in errors[0]["message"]


class _Resolver:
    """`socket.getaddrinfo` for one made-up host name: `answers` in turn (the last one repeats);
    every other name resolves as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, host: str, answers: list[str]) -> None:
        self.host, self.answers, self.calls = host, answers, 0
        real = socket.getaddrinfo

        def getaddrinfo(name: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            if name not in (host, host.encode()):
                return real(name, port, *args, **kwargs)
            address = self.answers[min(self.calls, len(self.answers) - 1)]
            self.calls += 1
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, int(port or 80)))]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


async def _stored_delivery(harness: Any, tenant: Tenant, url: str) -> str:
    hook_id, delivery_id = new_id("wh"), new_id("whd")
    await harness.rt.pool.execute(
        "INSERT INTO webhooks (id, workspace_id, url, events, secret) VALUES ($1, $2, $3, $4, 'whsec_x')",
        hook_id,
        tenant.workspace_id,
        url,
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
    return delivery_id


async def test_delivery_connects_to_the_address_it_checked_not_a_second_dns_answer(
    harness: Any, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name answers a (here: deemed) public address to the check and a private
    one to any later lookup. Delivery must reach the checked address, resolving the name once."""
    heard: dict[str, list[bytes]] = {"127.0.0.2": [], "127.0.0.3": []}

    def receiver(address: str) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            heard[address].append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()

        return handle

    checked = await asyncio.start_server(receiver("127.0.0.2"), "127.0.0.2", 0)
    port = checked.sockets[0].getsockname()[1]
    rebound = await asyncio.start_server(receiver("127.0.0.3"), "127.0.0.3", port)
    monkeypatch.setattr(address_module, "is_public", lambda address: address == "127.0.0.2")
    resolver = _Resolver(monkeypatch, "rebind.stevora.test", ["127.0.0.2", "127.0.0.3"])
    delivery_id = await _stored_delivery(harness, tenant, f"http://rebind.stevora.test:{port}/hook")
    try:
        assert await deliver_due(harness.rt) >= 1
    finally:
        checked.close()
        rebound.close()
    row = await harness.rt.pool.fetchrow("SELECT * FROM webhook_deliveries WHERE id = $1", delivery_id)
    assert (row["status"], row["last_status_code"]) == ("DELIVERED", 204), row["last_error"]
    assert heard["127.0.0.3"] == [] and len(heard["127.0.0.2"]) == 1
    assert f"host: rebind.stevora.test:{port}".encode() in heard["127.0.0.2"][0].lower()
    assert resolver.calls == 1


async def test_https_delivery_to_a_checked_address_keeps_the_host_name_for_tls_and_host(
    harness: Any, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200)

    resolver = _Resolver(monkeypatch, "hooks.stevora.test", ["93.184.215.14"])
    await _stored_delivery(harness, tenant, "https://hooks.stevora.test/in?x=1")
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        assert await deliver_due(harness.rt, client=http) >= 1
    (request,) = sent
    assert str(request.url) == "https://93.184.215.14/in?x=1"
    assert request.headers["host"] == "hooks.stevora.test"
    assert request.extensions["sni_hostname"] == "hooks.stevora.test"
    assert resolver.calls == 1
