"""Events, event waits and inbound hooks with real worker processes on both brokers: the API runs
in-process on a runtime that dispatches to the real broker, the runs execute in the workers.

Twenty concurrent posts of one event id start each matching definition's run once; a `batch`
trigger hands its run the events as a list (the remainder fired by a worker's pass at its
timeout); an `external_event` step resumes on the matching event and not on another; a
GitHub-signed delivery starts a run and a forged one stores nothing."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from stevora.api import create_app
from tests.e2e.conftest import BrokerSetup
from tests.e2e.workerproc import WorkerProcess
from tests.integration.api.api_helpers import Tenant, bootstrap_tenant, make_client

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]
QUICK = [{"name": "pause", "type": "wait", "durationMs": 0}]


@pytest.fixture
async def api(broker_setup: BrokerSetup) -> AsyncIterator[tuple[httpx.AsyncClient, Tenant, WorkerProcess]]:
    """The API on the broker's runtime, a tenant, and one real worker (FAST trigger pass)."""
    app = create_app(broker_setup.rt.settings, runtime=broker_setup.rt)
    worker = WorkerProcess(
        broker_setup.rt.settings.database_url, broker_setup.url, broker_setup.queue,
        extra_env={"STEVORA_TRIGGER_POLL_S": "0.2"},
    )  # fmt: skip
    try:
        async with make_client(app) as client:
            yield client, await bootstrap_tenant(client), worker
    finally:
        worker.stop()


async def _define(client: httpx.AsyncClient, tenant: Tenant, body: dict[str, Any]) -> str:
    response = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return str(response.json()["data"]["id"])


async def _until(probe: Callable[[], Awaitable[Any]], what: str, worker: WorkerProcess, s: float = 60) -> Any:
    for _ in range(int(s * 10)):
        found = await probe()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not within {s} s: {worker.log_tail()}")


async def _runs(setup: BrokerSetup, tenant: Tenant) -> list[Any]:
    return list(
        await setup.rt.pool.fetch(
            "SELECT r.id, r.status, r.input, r.output, r.state, d.name FROM workflow_runs r "
            "JOIN workflow_definitions d ON d.id = r.definition_id WHERE r.workspace_id = $1 ORDER BY r.created_at",
            tenant.workspace_id,
        )
    )


def _all_completed(setup: BrokerSetup, tenant: Tenant, count: int) -> Callable[[], Awaitable[Any]]:
    async def probe() -> Any:
        runs = await _runs(setup, tenant)
        return runs if len(runs) >= count and all(r["status"] == "COMPLETED" for r in runs) else None

    return probe


async def test_twenty_concurrent_posts_of_one_id_start_each_matching_run_once(
    broker_setup: BrokerSetup, api: tuple[httpx.AsyncClient, Tenant, WorkerProcess]
) -> None:
    client, tenant, worker = api
    big = {"event": "order.paid", "if": "data.amount >= 100", "input": {"order": "{{event.data.orderId}}"}}
    await _define(client, tenant, {"name": "big-orders", "version": "1", "steps": QUICK, "triggers": [big]})
    await _define(client, tenant, {"name": "all-orders", "version": "1", "steps": QUICK,
                                   "triggers": [{"event": "order.paid"}]})  # fmt: skip
    event = {"name": "order.paid", "id": "ord_1-paid", "data": {"orderId": "ord_1", "amount": 120}}
    answers = await asyncio.gather(
        *(client.post("/v1/events", json=event, headers=tenant.headers) for _ in range(20))
    )
    assert sorted({a.status_code for a in answers}) in ([200, 201], [201]), [a.text for a in answers]
    named = {tuple(sorted(r["runId"] for r in a.json()["data"]["runs"])) for a in answers}
    assert len(named) == 1 and len(next(iter(named))) == 2  # every answer names the same two runs
    small = {"name": "order.paid", "id": "ord_2-paid", "data": {"orderId": "ord_2", "amount": 5}}
    assert (await client.post("/v1/events", json=small, headers=tenant.headers)).status_code == 201
    runs = await _until(_all_completed(broker_setup, tenant, 3), "three completed runs", worker)
    assert sorted((r["name"], json.dumps(r["input"], sort_keys=True)) for r in runs) == [
        ("all-orders", json.dumps(event["data"], sort_keys=True)),
        ("all-orders", json.dumps(small["data"], sort_keys=True)),
        ("big-orders", json.dumps({"order": "ord_1"})),
    ]
    assert (
        await broker_setup.rt.pool.fetchval(
            "SELECT count(*) FROM trigger_events WHERE workspace_id = $1", tenant.workspace_id
        )
        == 2
    )


async def test_a_batch_run_receives_its_events_as_a_list_and_the_rest_at_the_timeout(
    broker_setup: BrokerSetup, api: tuple[httpx.AsyncClient, Tenant, WorkerProcess]
) -> None:
    client, tenant, worker = api
    batch = {"event": "line.added", "batch": {"maxSize": 5, "timeoutMs": 800}}
    await _define(client, tenant, {"name": "lines", "version": "1", "steps": QUICK, "triggers": [batch]})
    sent = [{"name": "line.added", "id": f"l{n}", "data": {"n": n}} for n in range(7)]
    answer = await client.post("/v1/events", json=sent, headers=tenant.headers)
    assert answer.status_code == 200, answer.text  # the batch form
    assert [len(e["runs"]) for e in answer.json()["data"]] == [0, 0, 0, 0, 1, 0, 0]  # full at the fifth
    runs = await _until(_all_completed(broker_setup, tenant, 2), "two batch runs", worker)
    assert len(runs) == 2
    received = [[e["data"]["n"] for e in r["input"]["events"]] for r in runs]
    assert received == [[0, 1, 2, 3, 4], [5, 6]]  # full at 5; the two left fired by the pass
    assert {e["name"] for r in runs for e in r["input"]["events"]} == {"line.added"}


async def test_a_waiting_step_resumes_on_the_matching_event_and_not_on_another(
    broker_setup: BrokerSetup, api: tuple[httpx.AsyncClient, Tenant, WorkerProcess]
) -> None:
    client, tenant, worker = api
    steps = [{"name": "shipped", "type": "external_event", "event": "order.shipped",
              "match": "data.orderId == input.orderId", "timeoutMs": 120_000}]  # fmt: skip
    definition_id = await _define(client, tenant, {"name": "ship", "version": "1", "steps": steps})
    ids = {}
    for order in ("a", "b"):
        made = await client.post(
            "/v1/workflow-runs", json={"definitionId": definition_id, "input": {"orderId": order}},
            headers=tenant.headers,
        )  # fmt: skip
        assert made.status_code == 201, made.text
        ids[order] = made.json()["data"]["id"]

    async def both_waiting() -> bool:
        return {r["status"] for r in await _runs(broker_setup, tenant)} == {"WAITING"}

    await _until(both_waiting, "both runs waiting", worker)
    shipped = {"name": "order.shipped", "data": {"orderId": "b", "carrier": "dhl"}}
    assert (await client.post("/v1/events", json=shipped, headers=tenant.headers)).status_code == 201
    other = {"name": "order.shipped", "data": {"orderId": "zzz"}}
    assert (await client.post("/v1/events", json=other, headers=tenant.headers)).status_code == 201

    async def b_done() -> Any:
        runs = {r["id"]: r for r in await _runs(broker_setup, tenant)}
        return runs if runs[ids["b"]]["status"] == "COMPLETED" else None

    runs = await _until(b_done, "run b completed", worker)
    assert runs[ids["b"]]["state"]["carrier"] == "dhl"
    await asyncio.sleep(1.5)  # the worker's passes had time to (wrongly) resume run a
    assert (await _runs(broker_setup, tenant))[0]["status"] == "WAITING"
    assert {r["id"] for r in await _runs(broker_setup, tenant) if r["status"] == "WAITING"} == {ids["a"]}


async def test_a_github_signed_delivery_starts_a_run_and_a_forged_one_stores_nothing(
    broker_setup: BrokerSetup, api: tuple[httpx.AsyncClient, Tenant, WorkerProcess]
) -> None:
    client, tenant, worker = api
    body = {"name": "review", "version": "1", "steps": QUICK, "triggers": [{"event": "github.pull_request"}]}
    await _define(client, tenant, body)
    made = await client.post("/v1/hooks", json={"provider": "github"}, headers=tenant.headers)
    assert made.status_code == 201, made.text
    hook = made.json()["data"]
    payload = json.dumps({"action": "opened", "number": 7}).encode()
    forged = await client.post(hook["url"], content=payload, headers={
        "x-github-event": "pull_request", "x-github-delivery": "d-forged",
        "x-hub-signature-256": "sha256=" + hmac.new(b"not-the-secret", payload, hashlib.sha256).hexdigest(),
    })  # fmt: skip
    assert forged.status_code == 401, forged.text
    signature = "sha256=" + hmac.new(hook["secret"].encode(), payload, hashlib.sha256).hexdigest()
    signed = await client.post(hook["url"], content=payload, headers={
        "x-github-event": "pull_request", "x-github-delivery": "d-1", "x-hub-signature-256": signature,
    })  # fmt: skip
    assert signed.status_code in (200, 201), signed.text
    runs = await _until(_all_completed(broker_setup, tenant, 1), "the hook's run completed", worker)
    assert len(runs) == 1 and runs[0]["input"] == {"action": "opened", "number": 7}
    events = await broker_setup.rt.pool.fetch(
        "SELECT name FROM trigger_events WHERE workspace_id = $1", tenant.workspace_id
    )
    assert [e["name"] for e in events] == ["github.pull_request"]  # the forged delivery left no row
