"""Approval requests: list, get, decide; a decision resumes (or fails) the run."""

from __future__ import annotations

import json
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import unquote

import httpx
from api_helpers import Conforms, DefinitionFactory, Tenant

from stevora.ui.auth import COOKIE_NAME, FLASH_COOKIE, csrf_token_for

APPROVAL_FIELDS = {
    "id", "workflowRunId", "stepRunId", "stepName", "contentKey", "content", "prompt", "status", "decision",
    "editedContent", "decidedBy", "decidedAt", "expiresAt", "awaitedToolCallId", "createdAt",
}  # fmt: skip


async def _awaiting_approval(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> tuple[str, dict[str, Any]]:
    """A run waiting on approval of `state.draft`; returns (run id, the pending approval)."""
    harness.tasks.register(
        "draft", lambda ctx: {"status": "completed", "stateUpdates": {"draft": {"subject": "Hi"}}}
    )
    harness.tasks.register(
        "send", lambda ctx: {"status": "completed", "stateUpdates": {"sent": ctx.workflow_state["draft"]}}
    )
    definition_id = await define(
        [
            {"type": "task", "name": "write", "handler": "draft"},
            {"type": "approval", "name": "review", "contentKey": "draft", "prompt": "Check the tone"},
            {"type": "task", "name": "send", "handler": "send"},
        ]
    )
    run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers)
    run_id: str = run.json()["data"]["id"]
    await harness.wait_for_status(run_id, "WAITING")
    pending = (await client.get("/v1/approval-requests?pending=true", headers=tenant.headers)).json()["data"]
    (approval,) = [a for a in pending if a["workflowRunId"] == run_id]
    return run_id, approval


async def test_pending_approval_is_listed_with_its_content(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    _, approval = await _awaiting_approval(client, tenant, define, harness)
    assert set(approval) == APPROVAL_FIELDS
    assert approval["id"].startswith("apr_") and approval["status"] == "PENDING"
    assert approval["stepName"] == "review" and approval["contentKey"] == "draft"
    assert approval["content"] == {"subject": "Hi"} and approval["prompt"] == "Check the tone"
    assert approval["decision"] is None and approval["decidedAt"] is None and approval["expiresAt"] is None
    got = await client.get(f"/v1/approval-requests/{approval['id']}", headers=tenant.headers)
    assert got.json()["data"] == approval
    decided = (await client.get("/v1/approval-requests?pending=false", headers=tenant.headers)).json()["data"]
    assert approval["id"] not in {a["id"] for a in decided}
    everything = (await client.get("/v1/approval-requests", headers=tenant.headers)).json()["data"]
    assert approval["id"] in {a["id"] for a in everything}


async def test_approved_decision_completes_the_run_with_the_content_unchanged(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, conforms: Conforms
) -> None:
    run_id, approval = await _awaiting_approval(client, tenant, define, harness)
    response = await client.post(
        f"/v1/approval-requests/{approval['id']}/decide",
        json={"decision": "approved", "decidedBy": "ana@example.com"},
        headers=tenant.headers,
    )
    assert response.status_code == 200
    conforms(response, "POST", "/v1/approval-requests/{approval_id}/decide")
    data = response.json()["data"]
    assert (
        data["status"] == "DECIDED"
        and data["decision"] == "approved"
        and data["decidedBy"] == "ana@example.com"
    )
    assert data["decidedAt"] is not None
    done = await harness.wait_for_status(run_id, "COMPLETED")
    assert done["state"]["sent"] == {"subject": "Hi"}
    listed = await client.get("/v1/approval-requests?pending=false", headers=tenant.headers)
    conforms(listed, "GET", "/v1/approval-requests")
    assert approval["id"] in {a["id"] for a in listed.json()["data"]}


async def test_edited_decision_replaces_the_content_in_state(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    run_id, approval = await _awaiting_approval(client, tenant, define, harness)
    edited = {"subject": "Hello there"}
    response = await client.post(
        f"/v1/approval-requests/{approval['id']}/decide",
        json={"decision": "edited", "editedContent": edited},
        headers=tenant.headers,
    )
    assert response.status_code == 200 and response.json()["data"]["editedContent"] == edited
    done = await harness.wait_for_status(run_id, "COMPLETED")
    assert done["state"]["draft"] == edited and done["state"]["sent"] == edited


async def test_rejected_decision_fails_the_run(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    run_id, approval = await _awaiting_approval(client, tenant, define, harness)
    response = await client.post(
        f"/v1/approval-requests/{approval['id']}/decide",
        json={"decision": "rejected"},
        headers=tenant.headers,
    )
    assert response.status_code == 200
    await harness.wait_for_status(run_id, "FAILED")
    run = (await client.get(f"/v1/workflow-runs/{run_id}", headers=tenant.headers)).json()["data"]
    assert run["error"]["code"] == "APPROVAL_REJECTED"
    assert "sent" not in run["state"]
    # A retry asks again: a new approval request for a new visit of the step.
    assert (await client.post(f"/v1/workflow-runs/{run_id}/retry", headers=tenant.headers)).status_code == 200
    await harness.wait_for_status(run_id, "WAITING")
    pending = (await client.get("/v1/approval-requests?pending=true", headers=tenant.headers)).json()["data"]
    (again,) = [a for a in pending if a["workflowRunId"] == run_id]
    assert again["id"] != approval["id"] and again["stepRunId"] != approval["stepRunId"]
    decide = await client.post(
        f"/v1/approval-requests/{again['id']}/decide", json={"decision": "approved"}, headers=tenant.headers
    )
    assert decide.status_code == 200
    await harness.wait_for_status(run_id, "COMPLETED")


async def test_decide_validates_and_refuses_a_second_decision(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    _, approval = await _awaiting_approval(client, tenant, define, harness)
    url = f"/v1/approval-requests/{approval['id']}/decide"
    bad = await client.post(url, json={"decision": "maybe"}, headers=tenant.headers)
    assert bad.status_code == 400
    assert bad.json()["error"]["details"]["errors"][0]["path"] == "decision"
    no_content = await client.post(url, json={"decision": "edited"}, headers=tenant.headers)
    assert no_content.status_code == 400
    assert no_content.json()["error"]["details"]["errors"][0]["path"] == "editedContent"
    assert (await client.post(url, json={"decision": "approved"}, headers=tenant.headers)).status_code == 200
    twice = await client.post(url, json={"decision": "rejected"}, headers=tenant.headers)
    assert twice.status_code == 409
    assert twice.json()["error"]["code"] == "INVALID_STATE_TRANSITION"
    unknown = await client.post(
        "/v1/approval-requests/apr_nope/decide", json={"decision": "approved"}, headers=tenant.headers
    )
    assert unknown.status_code == 404


async def test_another_workspaces_approval_is_404(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    run_id, approval = await _awaiting_approval(client, tenant, define, harness)
    assert (
        await client.get(f"/v1/approval-requests/{approval['id']}", headers=other_tenant.headers)
    ).status_code == 404
    decide = await client.post(
        f"/v1/approval-requests/{approval['id']}/decide",
        json={"decision": "approved"},
        headers=other_tenant.headers,
    )
    assert decide.status_code == 404
    assert (await client.get("/v1/approval-requests", headers=other_tenant.headers)).json()["data"] == []
    assert (
        await harness.rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", run_id)
    ) == "WAITING"


async def _decide_in_ui(client: httpx.AsyncClient, tenant: Tenant, approval_id: str, decision: str) -> str:
    """POST the UI's decide form as a logged-in browser would; the flash message it sets."""
    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        response = await client.post(
            f"/ui/approvals/{approval_id}/decide",
            data={"decision": decision, "csrf": csrf_token_for(tenant.key)},
        )
    finally:
        client.cookies.delete(COOKIE_NAME)
    assert response.status_code == 303, response.text
    jar = SimpleCookie(response.headers["set-cookie"])
    flash = json.loads(unquote(jar[FLASH_COOKIE].value))
    text: str = flash["text"]
    return text


async def test_ui_says_the_run_failed_after_a_rejection_and_continues_after_an_approval(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    rejected_run, rejected = await _awaiting_approval(client, tenant, define, harness)
    text = await _decide_in_ui(client, tenant, rejected["id"], "rejected")
    assert (await harness.wait_for_status(rejected_run, "FAILED"))["status"] == "FAILED"
    assert "continues" not in text
    assert text == f"Rejected {rejected['id']}. The run failed (APPROVAL_REJECTED)."
    approved_run, approved = await _awaiting_approval(client, tenant, define, harness)
    text = await _decide_in_ui(client, tenant, approved["id"], "approved")
    assert text == f"Approved {approved['id']}. The run continues."
    await harness.wait_for_status(approved_run, "COMPLETED")
