"""Workflow runs: create (idempotent), list, get, and the cancel / retry / pause / resume commands."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from api_helpers import Conforms, DefinitionFactory, Tenant

RUN_FIELDS = {
    "id", "workspaceId", "definitionId", "status", "currentStepName", "input", "state", "output", "error",
    "totalCostCents", "totalInputTokens", "totalOutputTokens", "startedAt", "completedAt", "failedAt",
    "cancelledAt", "nextRunAt", "idempotencyKey", "version", "parentRunId", "parentToolCallId", "requiredAction",
    "budget", "concurrencyKey", "concurrencyLimit", "priority", "queuedAt", "threadId", "createdAt", "updatedAt",
}  # fmt: skip
STEP_FIELDS = {
    "id", "workflowRunId", "stepName", "stepType", "stepIndex", "status", "visit", "attempt", "input",
    "output", "error", "signalType", "waitUntil", "startedAt", "completedAt", "durationMs", "createdAt",
    "updatedAt", "map",
}  # fmt: skip


async def _start(
    client: httpx.AsyncClient, tenant: Tenant, definition_id: str, **body: Any
) -> dict[str, Any]:
    response = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id, **body}, headers=tenant.headers
    )
    assert response.status_code == 201, response.text
    data: dict[str, Any] = response.json()["data"]
    return data


def _ok(harness: Any, name: str = "ok") -> None:
    harness.tasks.register(
        name, lambda ctx: {"status": "completed", "stateUpdates": {name: ctx.workflow_input}}
    )


async def test_create_returns_a_pending_run_with_every_field(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    _ok(harness)
    definition_id = await define([{"type": "task", "name": "a", "handler": "ok"}])
    run = await _start(client, tenant, definition_id, input={"leadId": 7}, idempotencyKey="order-1")
    assert set(run) == RUN_FIELDS
    assert run["status"] == "PENDING" and run["input"] == {"leadId": 7} and run["output"] is None
    assert run["idempotencyKey"] == "order-1" and run["workspaceId"] == tenant.workspace_id
    assert run["id"].startswith("wfrun_") and run["updatedAt"] == run["createdAt"]
    done = await harness.wait_for_status(run["id"], "COMPLETED")
    assert done["state"] == {"ok": {"leadId": 7}}


async def test_input_defaults_to_an_empty_object(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    _ok(harness)
    run = await _start(client, tenant, await define([{"type": "task", "name": "a", "handler": "ok"}]))
    assert run["input"] == {}


async def test_twenty_concurrent_identical_creates_make_one_run(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    _ok(harness)
    definition_id = await define([{"type": "task", "name": "a", "handler": "ok"}])
    body = {"definitionId": definition_id, "idempotencyKey": "process-order-42"}
    responses = await asyncio.gather(
        *(client.post("/v1/workflow-runs", json=body, headers=tenant.headers) for _ in range(20))
    )
    assert sorted(r.status_code for r in responses) == [200] * 19 + [201]
    assert len({r.json()["data"]["id"] for r in responses}) == 1
    count = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1 AND idempotency_key = $2",
        tenant.workspace_id,
        "process-order-42",
    )
    assert count == 1


async def test_idempotency_keys_are_scoped_to_the_workspace(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    _ok(harness)
    steps = [{"type": "task", "name": "a", "handler": "ok"}]
    mine = await _start(client, tenant, await define(steps), idempotencyKey="same")
    theirs = await _start(client, other_tenant, await define(steps, as_=other_tenant), idempotencyKey="same")
    assert mine["id"] != theirs["id"]


async def test_create_validation_and_missing_definition(
    client: httpx.AsyncClient,
    tenant: Tenant,
    other_tenant: Tenant,
    define: DefinitionFactory,
    conforms: Conforms,
) -> None:
    missing = await client.post("/v1/workflow-runs", json={"input": {}}, headers=tenant.headers)
    assert missing.status_code == 400
    assert missing.json()["error"]["details"]["errors"] == [
        {"path": "definitionId", "message": "Field required (or an ad-hoc `definition`)"}
    ]
    for body, path in (
        ({"definitionId": "x", "input": [1]}, "input"),
        ({"definitionId": "x", "idempotencyKey": "k" * 256}, "idempotencyKey"),
        ({"definitionId": "x", "surprise": 1}, "surprise"),
    ):
        response = await client.post("/v1/workflow-runs", json=body, headers=tenant.headers)
        assert response.status_code == 400
        assert response.json()["error"]["details"]["errors"][0]["path"] == path
    unknown = await client.post(
        "/v1/workflow-runs", json={"definitionId": "wfdef_nope"}, headers=tenant.headers
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "NOT_FOUND"
    conforms(unknown, "POST", "/v1/workflow-runs")
    conforms(missing, "POST", "/v1/workflow-runs")
    foreign = await define([{"type": "wait", "name": "w", "durationMs": 1}], as_=other_tenant)
    response = await client.post("/v1/workflow-runs", json={"definitionId": foreign}, headers=tenant.headers)
    assert response.status_code == 404


async def test_list_is_newest_first_paginated_and_filtered(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, conforms: Conforms
) -> None:
    _ok(harness)
    first_def = await define([{"type": "task", "name": "a", "handler": "ok"}])
    waiting_def = await define([{"type": "external_event", "name": "e", "signalType": "go"}])
    ids = [(await _start(client, tenant, first_def))["id"] for _ in range(3)]
    waiting = await _start(client, tenant, waiting_def)
    await harness.wait_for_status(waiting["id"], "WAITING")
    for run_id in ids:
        await harness.wait_for_status(run_id, "COMPLETED")

    listed = await client.get("/v1/workflow-runs?pageSize=3", headers=tenant.headers)
    conforms(listed, "GET", "/v1/workflow-runs")
    page = listed.json()
    assert page["meta"] == {"page": 1, "pageSize": 3, "total": 4, "totalPages": 2}
    assert [r["id"] for r in page["data"]] == [waiting["id"], *reversed(ids[1:])]
    second = (await client.get("/v1/workflow-runs?pageSize=3&page=2", headers=tenant.headers)).json()
    assert [r["id"] for r in second["data"]] == [ids[0]]
    beyond = (await client.get("/v1/workflow-runs?page=99", headers=tenant.headers)).json()
    assert beyond["data"] == [] and beyond["meta"]["total"] == 4

    by_status = (await client.get("/v1/workflow-runs?status=WAITING", headers=tenant.headers)).json()
    assert [r["id"] for r in by_status["data"]] == [waiting["id"]]
    by_def = (await client.get(f"/v1/workflow-runs?definitionId={first_def}", headers=tenant.headers)).json()
    assert by_def["meta"]["total"] == 3
    bad = await client.get("/v1/workflow-runs?status=DONE", headers=tenant.headers)
    assert bad.status_code == 400
    assert bad.json()["error"]["details"]["errors"][0]["path"] == "status"
    for query in ("pageSize=101", "pageSize=0", "page=0"):
        assert (await client.get(f"/v1/workflow-runs?{query}", headers=tenant.headers)).status_code == 400


async def test_get_includes_step_runs_in_order_and_the_definition(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, conforms: Conforms
) -> None:
    _ok(harness)
    definition_id = await define(
        [{"type": "task", "name": "a", "handler": "ok"}, {"type": "wait", "name": "w", "durationMs": 20}],
        name="two-steps",
    )
    run = await _start(client, tenant, definition_id)
    await harness.wait_for_status(run["id"], "COMPLETED")
    response = await client.get(f"/v1/workflow-runs/{run['id']}", headers=tenant.headers)
    conforms(response, "GET", "/v1/workflow-runs/{run_id}")
    data = response.json()["data"]
    assert set(data) == RUN_FIELDS | {"stepRuns", "definition", "budgetUsed", "queuePosition"}
    assert data["definition"] == {"name": "two-steps", "version": "1.0.0"}
    assert [s["stepName"] for s in data["stepRuns"]] == ["a", "w"]
    assert all(set(s) == STEP_FIELDS for s in data["stepRuns"])
    wait_step = data["stepRuns"][1]
    assert wait_step["stepType"] == "wait" and wait_step["status"] == "COMPLETED"
    assert wait_step["durationMs"] >= 15
    assert data["status"] == "COMPLETED" and data["completedAt"] is not None


async def test_cancel_a_waiting_run_and_refuse_to_cancel_twice(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    run = await _start(
        client, tenant, await define([{"type": "external_event", "name": "e", "signalType": "go"}])
    )
    await harness.wait_for_status(run["id"], "WAITING")
    cancelled = await client.post(f"/v1/workflow-runs/{run['id']}/cancel", headers=tenant.headers)
    assert cancelled.status_code == 200
    data = cancelled.json()["data"]
    assert data["status"] == "CANCELLED" and data["cancelledAt"] is not None
    again = await client.post(f"/v1/workflow-runs/{run['id']}/cancel", headers=tenant.headers)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "INVALID_STATE_TRANSITION"


async def test_retry_a_failed_run_until_it_completes(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    calls = []

    async def flaky(ctx: Any) -> dict[str, Any]:
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise RuntimeError("upstream down")
        return {"status": "completed"}

    harness.tasks.register("flaky", flaky)
    run = await _start(
        client,
        tenant,
        await define([{"type": "task", "name": "f", "handler": "flaky", "retry": {"maxAttempts": 1}}]),
    )
    await harness.wait_for_status(run["id"], "FAILED")
    failed = (await client.get(f"/v1/workflow-runs/{run['id']}", headers=tenant.headers)).json()["data"]
    assert failed["failedAt"] is not None and failed["error"]["stepName"] == "f"
    retried = await client.post(f"/v1/workflow-runs/{run['id']}/retry", headers=tenant.headers)
    assert retried.status_code == 200
    assert retried.json()["data"]["status"] in ("RUNNING", "COMPLETED")
    await harness.wait_for_status(run["id"], "COMPLETED")
    not_failed = await client.post(f"/v1/workflow-runs/{run['id']}/retry", headers=tenant.headers)
    assert not_failed.status_code == 409
    assert not_failed.json()["error"]["code"] == "INVALID_STATE_TRANSITION"


async def test_pause_a_running_run_then_resume_it(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    async def slow(ctx: Any) -> dict[str, Any]:
        entered.set()
        await release.wait()
        return {"status": "completed", "stateUpdates": {"slow": True}}

    harness.tasks.register("slow", slow)
    run = await _start(client, tenant, await define([{"type": "task", "name": "s", "handler": "slow"}]))
    await asyncio.wait_for(entered.wait(), 5)
    paused = await client.post(f"/v1/workflow-runs/{run['id']}/pause", headers=tenant.headers)
    assert paused.status_code == 200 and paused.json()["data"]["status"] == "PAUSED"
    again = await client.post(f"/v1/workflow-runs/{run['id']}/pause", headers=tenant.headers)
    assert again.status_code == 409
    release.set()
    await asyncio.sleep(0.1)
    assert (
        await harness.rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", run["id"])
    ) == "PAUSED"
    resumed = await client.post(f"/v1/workflow-runs/{run['id']}/resume", headers=tenant.headers)
    assert resumed.status_code == 200
    done = await harness.wait_for_status(run["id"], "COMPLETED")
    assert done["state"] == {"slow": True}


async def test_resume_delivers_a_signal_and_merges_its_payload(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    definition_id = await define(
        [{"type": "external_event", "name": "pay", "signalType": "payment_confirmed"}]
    )
    run = await _start(client, tenant, definition_id)
    await harness.wait_for_status(run["id"], "WAITING")
    url = f"/v1/workflow-runs/{run['id']}/resume"
    no_signal = await client.post(url, json={}, headers=tenant.headers)
    assert no_signal.status_code == 409  # a valid body the run's status does not fit
    assert no_signal.json()["error"]["details"]["errors"][0]["path"] == "signalType"
    wrong = await client.post(url, json={"signalType": "refund"}, headers=tenant.headers)
    assert wrong.status_code == 409
    assert wrong.json()["error"]["code"] == "SIGNAL_MISMATCH"
    right = await client.post(
        url, json={"signalType": "payment_confirmed", "payload": {"amount": 42}}, headers=tenant.headers
    )
    assert right.status_code == 200
    assert right.json()["data"]["state"] == {"amount": 42}
    done = await harness.wait_for_status(run["id"], "COMPLETED")
    assert done["output"] == {"amount": 42}
    late = await client.post(url, json={"signalType": "payment_confirmed"}, headers=tenant.headers)
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "INVALID_STATE_TRANSITION"


async def test_every_run_route_is_404_for_another_workspaces_run(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    run = await _start(
        client, tenant, await define([{"type": "external_event", "name": "e", "signalType": "go"}])
    )
    await harness.wait_for_status(run["id"], "WAITING")
    base = f"/v1/workflow-runs/{run['id']}"
    requests = [
        ("GET", base), ("POST", f"{base}/cancel"), ("POST", f"{base}/retry"), ("POST", f"{base}/pause"),
        ("POST", f"{base}/resume"), ("GET", f"{base}/events"), ("GET", f"{base}/events/stream"),
        ("GET", f"{base}/llm-calls"), ("GET", f"{base}/tool-traces"), ("GET", f"{base}/cost"),
    ]  # fmt: skip
    for method, url in requests:
        response = await client.request(method, url, headers=other_tenant.headers)
        assert response.status_code == 404, (method, url, response.text)
        assert response.json()["error"]["code"] == "NOT_FOUND"
    listed = (await client.get("/v1/workflow-runs", headers=other_tenant.headers)).json()
    assert listed["meta"]["total"] == 0
    still = (await client.get(base, headers=tenant.headers)).json()["data"]
    assert still["status"] == "WAITING"
