"""Webhooks: the API, and signed at-least-once delivery with retries to a real local receiver."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from api_helpers import Conforms, DefinitionFactory, Tenant

from stevora.settings import Settings
from stevora.webhooks import deliver_due, sign, verify_signature


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """These tests deliver to a receiver on 127.0.0.1, which production refuses (SSRF guard)."""
    return settings.model_copy(update={"webhook_allow_private": True})


class Receiver:
    """A stdlib HTTP server on 127.0.0.1:0 that verifies signatures and answers from a script."""

    def __init__(self) -> None:
        self.secret = ""
        self.statuses: list[int] = []  # answers to give, in order; then 200
        self.requests: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append(
                    {
                        "headers": headers,
                        "body": body,
                        "valid": verify_signature(
                            receiver.secret,
                            headers["x-stevora-timestamp"],
                            body,
                            headers["x-stevora-signature"],
                        ),
                    }
                )
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"nope" if status >= 300 else b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


async def _subscribe(
    client: httpx.AsyncClient, tenant: Tenant, url: str, events: list[str]
) -> dict[str, Any]:
    response = await client.post("/v1/webhooks", json={"url": url, "events": events}, headers=tenant.headers)
    assert response.status_code == 201, response.text
    data: dict[str, Any] = response.json()["data"]
    return data


async def _complete_a_run(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> str:
    harness.tasks.register("noop", lambda ctx: None)
    definition_id = await define([{"type": "task", "name": "n", "handler": "noop"}])
    run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers)
    run_id: str = run.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")
    return run_id


async def _make_due(harness: Any, webhook_id: str) -> None:
    await harness.rt.pool.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = now() WHERE webhook_id = $1 AND status = 'PENDING'",
        webhook_id,
    )


async def test_create_list_and_delete_a_webhook(
    client: httpx.AsyncClient, tenant: Tenant, conforms: Conforms
) -> None:
    created = await _subscribe(
        client, tenant, "https://example.com/h", ["workflow.completed", "workflow.completed"]
    )
    assert created["secret"].startswith("whsec_") and len(created["secret"]) == len("whsec_") + 32
    assert created["events"] == ["workflow.completed"] and created["isActive"] is True
    assert created["id"].startswith("wh_") and created["workspaceId"] == tenant.workspace_id
    response = await client.get("/v1/webhooks", headers=tenant.headers)
    conforms(response, "GET", "/v1/webhooks")
    listed = response.json()["data"]
    assert [w["id"] for w in listed] == [created["id"]]
    assert "secret" not in listed[0]
    deleted = await client.delete(f"/v1/webhooks/{created['id']}", headers=tenant.headers)
    assert deleted.status_code == 200 and "secret" not in deleted.json()["data"]
    assert (await client.delete(f"/v1/webhooks/{created['id']}", headers=tenant.headers)).status_code == 404
    assert (await client.get("/v1/webhooks", headers=tenant.headers)).json()["data"] == []


async def test_webhook_url_and_events_are_validated(client: httpx.AsyncClient, tenant: Tenant) -> None:
    cases = [
        ({"url": "ftp://example.com", "events": ["workflow.failed"]}, "url"),
        ({"url": "not a url", "events": ["workflow.failed"]}, "url"),
        ({"url": "https://example.com", "events": []}, "events"),
        ({"url": "https://example.com", "events": ["workflow.exploded"]}, "events[0]"),
    ]
    for body, path in cases:
        response = await client.post("/v1/webhooks", json=body, headers=tenant.headers)
        assert response.status_code == 400, body
        assert response.json()["error"]["details"]["errors"][0]["path"] == path


async def test_another_workspaces_webhook_is_404(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    created = await _subscribe(client, tenant, "https://example.com/h", ["workflow.failed"])
    for method, url in (
        ("DELETE", f"/v1/webhooks/{created['id']}"),
        ("GET", f"/v1/webhooks/{created['id']}/deliveries"),
    ):
        response = await client.request(method, url, headers=other_tenant.headers)
        assert response.status_code == 404
    assert (await client.get("/v1/webhooks", headers=other_tenant.headers)).json()["data"] == []


async def test_failed_delivery_is_retried_signed_and_logged(
    client: httpx.AsyncClient,
    tenant: Tenant,
    define: DefinitionFactory,
    harness: Any,
    receiver: Receiver,
    conforms: Conforms,
) -> None:
    hook = await _subscribe(client, tenant, receiver.url, ["workflow.completed"])
    receiver.secret = hook["secret"]
    receiver.statuses = [500]
    run_id = await _complete_a_run(client, tenant, define, harness)

    assert await deliver_due(harness.rt) >= 1
    log_url = f"/v1/webhooks/{hook['id']}/deliveries"
    first = (await client.get(log_url, headers=tenant.headers)).json()
    (delivery,) = first["data"]
    assert delivery["status"] == "PENDING" and delivery["attempts"] == 1 and delivery["lastStatusCode"] == 500
    next_at = delivery["nextAttemptAt"]
    assert next_at is not None
    # Not due yet (backoff): another test's due delivery may be sent, never this one.
    await deliver_due(harness.rt)
    (unchanged,) = (await client.get(log_url, headers=tenant.headers)).json()["data"]
    assert unchanged["attempts"] == 1 and unchanged["status"] == "PENDING"

    await _make_due(harness, hook["id"])
    assert await deliver_due(harness.rt) >= 1
    delivered = await client.get(log_url, headers=tenant.headers)
    conforms(delivered, "GET", "/v1/webhooks/{webhook_id}/deliveries")
    (delivery,) = delivered.json()["data"]
    assert (
        delivery["status"] == "DELIVERED"
        and delivery["attempts"] == 2
        and delivery["deliveredAt"] is not None
    )
    assert [a["statusCode"] for a in delivery["attemptLog"]] == [500, 200]
    assert [a["attempt"] for a in delivery["attemptLog"]] == [1, 2]
    assert delivery["attemptLog"][0]["error"].startswith("HTTP 500")
    assert all(a["durationMs"] >= 0 for a in delivery["attemptLog"])

    assert len(receiver.requests) == 2 and all(r["valid"] for r in receiver.requests)
    headers = receiver.requests[1]["headers"]
    assert headers["content-type"] == "application/json"
    assert headers["x-stevora-event"] == "workflow.completed"
    assert (
        headers["x-stevora-delivery"]
        == delivery["id"]
        == receiver.requests[0]["headers"]["x-stevora-delivery"]
    )
    payload = json.loads(receiver.requests[1]["body"])
    assert payload["event"] == "workflow.completed" and payload["data"]["workflowRunId"] == run_id
    assert payload["data"]["status"] == "COMPLETED" and payload == delivery["payload"]
    filtered = (await client.get(f"{log_url}?status=FAILED", headers=tenant.headers)).json()
    assert filtered["data"] == [] and filtered["meta"]["total"] == 0


async def test_delivery_gives_up_after_max_attempts(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(
        harness.rt, "settings", harness.rt.settings.model_copy(update={"webhook_max_attempts": 2})
    )
    hook = await _subscribe(client, tenant, "http://127.0.0.1:1/unreachable", ["workflow.completed"])
    await _complete_a_run(client, tenant, define, harness)
    await deliver_due(harness.rt)
    await _make_due(harness, hook["id"])
    await deliver_due(harness.rt)
    (delivery,) = (await client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=tenant.headers)).json()[
        "data"
    ]
    assert delivery["status"] == "FAILED" and delivery["attempts"] == 2 and delivery["nextAttemptAt"] is None
    assert delivery["attemptLog"][0]["statusCode"] is None and "Connect" in delivery["attemptLog"][0]["error"]


async def test_concurrent_sweepers_send_each_delivery_once(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, receiver: Receiver
) -> None:
    hook = await _subscribe(client, tenant, receiver.url, ["workflow.completed"])
    receiver.secret = hook["secret"]
    for _ in range(5):
        await _complete_a_run(client, tenant, define, harness)
    await asyncio.gather(*(deliver_due(harness.rt) for _ in range(4)))
    ids = [r["headers"]["x-stevora-delivery"] for r in receiver.requests]
    assert len(ids) == 5 and len(set(ids)) == 5


def test_verify_signature_rejects_tampering_stale_timestamps_and_wrong_secrets() -> None:
    now = int(time.time())
    body = b'{"id":"whevt_1","event":"workflow.failed"}'
    header = sign("whsec_abc", now, body)
    assert header.startswith("sha256=") and len(header) == len("sha256=") + 64
    assert verify_signature("whsec_abc", now, body, header)
    assert verify_signature("whsec_abc", str(now), body.decode(), header)
    assert not verify_signature("whsec_abc", now, body + b" ", header)
    assert not verify_signature("whsec_other", now, body, header)
    assert not verify_signature("whsec_abc", now - 301, body, sign("whsec_abc", now - 301, body))
    assert not verify_signature("whsec_abc", "not-a-number", body, header)


async def test_each_event_is_delivered_under_its_own_name(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, receiver: Receiver
) -> None:
    events = [
        "workflow.completed",
        "workflow.failed",
        "workflow.cancelled",
        "approval.requested",
        "approval.decided",
    ]
    hook = await _subscribe(client, tenant, receiver.url, events)
    receiver.secret = hook["secret"]
    harness.tasks.register("draft", lambda ctx: {"status": "completed", "stateUpdates": {"draft": "v1"}})
    definition_id = await define(
        [
            {"type": "task", "name": "write", "handler": "draft"},
            {"type": "approval", "name": "review", "contentKey": "draft", "prompt": "Ship it?"},
        ]
    )
    h = tenant.headers

    async def waiting_run() -> tuple[str, str]:
        run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=h)
        run_id: str = run.json()["data"]["id"]
        await harness.wait_for_status(run_id, "WAITING")
        approval_id: str = await harness.rt.pool.fetchval(
            "SELECT id FROM approval_requests WHERE workflow_run_id = $1", run_id
        )
        return run_id, approval_id

    rejected_run, approval_id = await waiting_run()
    decided = await client.post(
        f"/v1/approval-requests/{approval_id}/decide", json={"decision": "rejected"}, headers=h
    )
    assert decided.status_code == 200, decided.text
    await harness.wait_for_status(rejected_run, "FAILED")
    cancelled_run, _ = await waiting_run()
    assert (await client.post(f"/v1/workflow-runs/{cancelled_run}/cancel", headers=h)).status_code == 200
    await harness.wait_for_status(cancelled_run, "CANCELLED")

    while await deliver_due(harness.rt):
        pass
    received = [(r["headers"]["x-stevora-event"], json.loads(r["body"])) for r in receiver.requests]
    assert all(header == body["event"] for header, body in received)
    by_run: dict[str, list[str]] = {}
    for name, body in received:
        by_run.setdefault(body["data"]["workflowRunId"], []).append(name)
    assert sorted(by_run[rejected_run]) == ["approval.decided", "approval.requested", "workflow.failed"]
    assert sorted(by_run[cancelled_run]) == ["approval.requested", "workflow.cancelled"]
    assert all(r["valid"] for r in receiver.requests)
