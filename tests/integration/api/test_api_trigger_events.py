"""Events: triggers start runs exactly once per event id; debounce, batch; waiting steps resumed."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from api_helpers import Tenant

from stevora.triggers import grouping

pytestmark = pytest.mark.timeout(60)

QUICK = [{"name": "pause", "type": "wait", "durationMs": 0}]


async def _define(client: httpx.AsyncClient, tenant: Tenant, name: str, **extra: Any) -> str:
    body = {"name": name, "version": "1.0.0", "steps": extra.pop("steps", QUICK), **extra}
    response = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return str(response.json()["data"]["id"])


async def _send(client: httpx.AsyncClient, tenant: Tenant, body: Any) -> httpx.Response:
    return await client.post("/v1/events", json=body, headers=tenant.headers)


async def _runs(harness: Any, workspace_id: str) -> list[Any]:
    return list(
        await harness.rt.pool.fetch(
            "SELECT id, input, definition_id FROM workflow_runs WHERE workspace_id = $1 ORDER BY created_at",
            workspace_id,
        )
    )


async def test_an_event_starts_the_runs_whose_trigger_and_condition_match(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    big = await _define(
        client,
        tenant,
        "big-orders",
        triggers=[
            {"event": "order.paid", "if": "data.amount >= 100", "input": {"order": "{{event.data.orderId}}"}}
        ],
    )
    every = await _define(client, tenant, "all-orders", triggers=[{"event": "order.paid"}])
    await _define(client, tenant, "refunds", triggers=[{"event": "order.refunded"}])
    small = await _send(client, tenant, {"name": "order.paid", "data": {"orderId": "o1", "amount": 50}})
    assert small.status_code == 201, small.text
    assert [r["definitionId"] for r in small.json()["data"]["runs"]] == [every]
    large = await _send(client, tenant, {"name": "order.paid", "data": {"orderId": "o2", "amount": 150.5}})
    started = {r["definitionId"]: r["runId"] for r in large.json()["data"]["runs"]}
    assert set(started) == {big, every}
    inputs = {r["id"]: r["input"] for r in await _runs(harness, tenant.workspace_id)}
    assert inputs[started[big]] == {"order": "o2"}
    assert inputs[started[every]] == {"orderId": "o2", "amount": 150.5}  # no input: the event's data
    listed = await client.get("/v1/events", params={"name": "order.paid"}, headers=tenant.headers)
    assert [len(e["runs"]) for e in listed.json()["data"]] == [2, 1]


async def test_twenty_concurrent_posts_of_one_event_id_start_its_runs_once(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _define(client, tenant, "once", triggers=[{"event": "user.signed_up"}])
    body = {"name": "user.signed_up", "id": "evt-42", "data": {"user": "u1"}}
    answers = await asyncio.gather(*(_send(client, tenant, body) for _ in range(20)))
    assert sorted(a.status_code for a in answers) == [200] * 19 + [201]
    run_ids = {tuple(r["runId"] for r in a.json()["data"]["runs"]) for a in answers}
    assert len(run_ids) == 1 and len(next(iter(run_ids))) == 1
    assert sum(a.json()["data"]["deduplicated"] for a in answers) == 19
    assert len(await _runs(harness, tenant.workspace_id)) == 1
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM trigger_events WHERE workspace_id = $1", tenant.workspace_id
        )
        == 1
    )


async def test_the_batch_form_answers_each_event_in_order(client: httpx.AsyncClient, tenant: Tenant) -> None:
    await _define(client, tenant, "counted", triggers=[{"event": "tick"}])
    answer = await _send(
        client, tenant, [{"name": "tick", "data": {"n": n}} for n in range(3)] + [{"name": "other"}]
    )
    assert answer.status_code == 200, answer.text
    assert [len(e["runs"]) for e in answer.json()["data"]] == [1, 1, 1, 0]
    bad = await _send(client, tenant, [{"name": "tick"}, {"name": ""}])
    assert bad.status_code == 400 and "[1].name" in bad.text


async def test_a_bad_trigger_expression_is_refused_at_definition_create(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    body = {
        "name": "bad",
        "version": "1",
        "steps": QUICK,
        "triggers": [{"event": "x", "if": "data.amount >="}],
    }
    response = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert response.status_code == 400
    assert "triggers.0.if" in response.text or "triggers[0].if" in response.text


async def test_a_trigger_whose_input_breaks_the_schema_skips_only_itself(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    await _define(
        client,
        tenant,
        "strict",
        inputSchema={"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
        triggers=[{"event": "e"}],
    )
    loose = await _define(client, tenant, "loose", triggers=[{"event": "e"}])
    answer = await _send(client, tenant, {"name": "e", "data": {"n": "not a number"}})
    assert answer.status_code == 201
    assert [r["definitionId"] for r in answer.json()["data"]["runs"]] == [loose]


async def test_a_burst_of_ten_events_with_one_debounce_key_makes_one_run_with_the_last_data(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _define(
        client,
        tenant,
        "debounced",
        triggers=[{"event": "doc.edited", "debounce": {"key": "data.docId", "periodMs": 300}}],
    )
    for n in range(10):
        await _send(client, tenant, {"name": "doc.edited", "data": {"docId": "d1", "rev": n}})
    await _send(client, tenant, {"name": "doc.edited", "data": {"docId": "d2", "rev": 0}})
    assert await grouping.fire_due(harness.rt) == []  # not yet: 300 ms after the last event
    await asyncio.sleep(0.4)
    started = await grouping.fire_due(harness.rt)
    assert len(started) == 2 and await grouping.fire_due(harness.rt) == []
    inputs = sorted(
        (r["input"]["docId"], r["input"]["rev"]) for r in await _runs(harness, tenant.workspace_id)
    )
    assert inputs == [("d1", 9), ("d2", 0)]
    events = (await client.get("/v1/events", headers=tenant.headers)).json()["data"]
    assert all(len(e["runs"]) == 1 for e in events)


async def test_a_batch_run_receives_its_events_as_a_list(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _define(
        client, tenant, "batched", triggers=[{"event": "row", "batch": {"maxSize": 3, "timeoutMs": 300}}]
    )
    answers = [await _send(client, tenant, {"name": "row", "data": {"n": n}}) for n in range(4)]
    assert [len(a.json()["data"]["runs"]) for a in answers] == [0, 0, 1, 0]  # the third fills it
    found = await _runs(harness, tenant.workspace_id)
    assert [[e["data"]["n"] for e in r["input"]["events"]] for r in found] == [[0, 1, 2]]
    await asyncio.sleep(0.4)
    await grouping.fire_due(harness.rt)  # the fourth, after timeoutMs
    found = await _runs(harness, tenant.workspace_id)
    assert [[e["data"]["n"] for e in r["input"]["events"]] for r in found] == [[0, 1, 2], [3]]
    assert set(found[1]["input"]["events"][0]) == {"name", "data", "id", "ts"}


async def test_a_waiting_step_resumes_on_the_matching_event_only(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    steps = [
        {
            "name": "paid",
            "type": "external_event",
            "event": "order.paid",
            "match": "data.orderId == input.orderId",
        },
        {"name": "done", "type": "wait", "durationMs": 0},
    ]
    definition = await _define(client, tenant, "waits", steps=steps)
    early = await _send(client, tenant, {"name": "order.paid", "data": {"orderId": "A", "early": True}})
    assert early.json()["data"]["runs"] == []
    run = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition, "input": {"orderId": "A"}},
        headers=tenant.headers,
    )
    run_id = run.json()["data"]["id"]
    await harness.wait_for_status(run_id, "WAITING")  # the early event is not matched (it came before)
    other = await _send(client, tenant, {"name": "order.paid", "data": {"orderId": "B"}})
    assert other.json()["data"]["runs"] == []
    assert (
        await harness.rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", run_id)
    ) == "WAITING"
    match = await _send(client, tenant, {"name": "order.paid", "data": {"orderId": "A", "total": 12}})
    assert [(r["runId"], r["kind"]) for r in match.json()["data"]["runs"]] == [(run_id, "resumed")]
    done = await harness.wait_for_status(run_id, "COMPLETED")
    assert done["state"]["total"] == 12
    output = await harness.rt.pool.fetchval(
        "SELECT output FROM step_runs WHERE workflow_run_id = $1 AND step_name = 'paid'", run_id
    )
    assert output == {"orderId": "A", "total": 12}


async def test_an_event_step_needs_an_event_or_a_signal_and_a_valid_match(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    for step, needle in [
        ({"name": "s", "type": "external_event"}, "exactly one of signalType and event"),
        ({"name": "s", "type": "external_event", "event": "e", "match": "data.x =="}, "match"),
    ]:
        body = {"name": "bad", "version": "1", "steps": [step]}
        response = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
        assert response.status_code == 400 and needle in response.text, response.text
