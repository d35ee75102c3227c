"""Run events: pages by sequence (fast at depth) and the Server-Sent Events stream."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from api_helpers import Conforms, DefinitionFactory, Tenant
from fastapi import FastAPI

EVENT_FIELDS = {"id", "workflowRunId", "stepRunId", "sequence", "eventType", "payload", "createdAt"}


def parse_sse(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(events as {id, event, data}, comment lines) from an event-stream body."""
    events, comments = [], []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields: dict[str, Any] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                comments.append(line)
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
            events.append(fields)
    return events, comments


async def _waiting_run(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> str:
    definition_id = await define([{"type": "external_event", "name": "e", "signalType": "go"}])
    response = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )
    run_id: str = response.json()["data"]["id"]
    await harness.wait_for_status(run_id, "WAITING")
    return run_id


async def _add_events(harness: Any, run_id: str, count: int) -> int:
    """Append `count` synthetic events the way the engine does (counter and rows in one transaction)."""
    async with harness.rt.pool.acquire() as conn, conn.transaction():
        last = await conn.fetchval(
            "UPDATE workflow_runs SET event_seq = event_seq + $2 WHERE id = $1 RETURNING event_seq",
            run_id,
            count,
        )
        await conn.execute(
            "INSERT INTO workflow_events (id, workflow_run_id, sequence, event_type, payload) "
            "SELECT 'evt_' || substr(md5($1 || s), 1, 24), $1, s, 'SYNTHETIC', jsonb_build_object('n', s) "
            "FROM generate_series($2::int, $3::int) AS s",
            run_id,
            last - count + 1,
            last,
        )
    total: int = last
    return total


async def test_events_are_oldest_first_with_meta(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, conforms: Conforms
) -> None:
    run_id = await _waiting_run(client, tenant, define, harness)
    response = await client.get(f"/v1/workflow-runs/{run_id}/events", headers=tenant.headers)
    assert response.status_code == 200
    conforms(response, "GET", "/v1/workflow-runs/{run_id}/events")
    body = response.json()
    types = [e["eventType"] for e in body["data"]]
    assert types[:3] == ["WORKFLOW_STARTED", "STEP_STARTED", "WORKFLOW_PAUSED"]
    assert [e["sequence"] for e in body["data"]] == list(range(1, len(types) + 1))
    assert all(set(e) == EVENT_FIELDS for e in body["data"])
    assert body["data"][0]["stepRunId"] is None and body["data"][1]["stepRunId"].startswith("srun_")
    assert body["data"][2]["payload"]["signalType"] == "go"
    assert body["meta"] == {"page": 1, "pageSize": 20, "total": len(types), "totalPages": 1}


async def test_event_pages_at_depth_are_exact_and_fast(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    run_id = await _waiting_run(client, tenant, define, harness)
    total = await _add_events(harness, run_id, 5000)
    url = f"/v1/workflow-runs/{run_id}/events"
    last_page = (total + 99) // 100
    started = time.perf_counter()
    deep = (await client.get(f"{url}?page={last_page}&pageSize=100", headers=tenant.headers)).json()
    elapsed = time.perf_counter() - started
    assert deep["meta"] == {"page": last_page, "pageSize": 100, "total": total, "totalPages": last_page}
    assert [e["sequence"] for e in deep["data"]] == list(range((last_page - 1) * 100 + 1, total + 1))
    assert elapsed < 0.5
    middle = (await client.get(f"{url}?page=7&pageSize=13", headers=tenant.headers)).json()
    assert [e["sequence"] for e in middle["data"]] == list(range(79, 92))
    past = (await client.get(f"{url}?page={last_page + 1}&pageSize=100", headers=tenant.headers)).json()
    assert past["data"] == [] and past["meta"]["total"] == total
    huge = await client.get(f"{url}?page={10**30}", headers=tenant.headers)
    assert huge.status_code == 200 and huge.json()["data"] == []


async def test_event_paging_is_validated(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    run_id = await _waiting_run(client, tenant, define, harness)
    for query in ("page=0", "pageSize=0", "pageSize=101", "page=x"):
        response = await client.get(f"/v1/workflow-runs/{run_id}/events?{query}", headers=tenant.headers)
        assert response.status_code == 400, query
    assert (
        await client.get("/v1/workflow-runs/wfrun_nope/events", headers=tenant.headers)
    ).status_code == 404


async def test_stream_sends_every_event_until_the_run_completes(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    app.state.ctx.sse_poll_s = 0.05
    harness.tasks.register("prepare", lambda ctx: {"status": "completed", "stateUpdates": {"ready": True}})
    definition_id = await define(
        [
            {"type": "task", "name": "prepare", "handler": "prepare"},
            {"type": "wait", "name": "w", "durationMs": 300},
        ]
    )
    run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers)
    run_id = run.json()["data"]["id"]
    response = await client.get(f"/v1/workflow-runs/{run_id}/events/stream", headers=tenant.headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    events, _ = parse_sse(response.text)
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    assert [e["event"] for e in events] == [e["data"]["eventType"] for e in events]
    assert events[-1]["event"] == "WORKFLOW_COMPLETED"
    assert {"STEP_STARTED", "STEP_COMPLETED", "WORKFLOW_PAUSED", "WORKFLOW_RESUMED"} <= {
        e["event"] for e in events
    }
    paged = (
        await client.get(f"/v1/workflow-runs/{run_id}/events?pageSize=100", headers=tenant.headers)
    ).json()
    assert [e["data"] for e in events] == paged["data"]


async def test_stream_resumes_after_last_event_id_or_after_param(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    app.state.ctx.sse_poll_s = 0.05
    harness.tasks.register("noop", lambda ctx: None)
    definition_id = await define([{"type": "task", "name": "n", "handler": "noop"}])
    run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers)
    run_id = run.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")
    url = f"/v1/workflow-runs/{run_id}/events/stream"
    full, _ = parse_sse((await client.get(url, headers=tenant.headers)).text)
    resumed, _ = parse_sse((await client.get(url, headers={**tenant.headers, "Last-Event-ID": "2"})).text)
    assert resumed == full[2:]
    after, _ = parse_sse((await client.get(f"{url}?after=3", headers=tenant.headers)).text)
    assert after == full[3:]
    done, _ = parse_sse(
        (await client.get(url, headers={**tenant.headers, "Last-Event-ID": str(len(full))})).text
    )
    assert done == []
    bad = await client.get(url, headers={**tenant.headers, "Last-Event-ID": "abc"})
    assert bad.status_code == 400


async def test_stream_sends_keep_alive_comments_while_idle(
    app: FastAPI, client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    app.state.ctx.sse_poll_s = 0.05
    app.state.ctx.sse_keepalive_s = 0.1
    definition_id = await define([{"type": "wait", "name": "w", "durationMs": 600}])
    run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers)
    response = await client.get(
        f"/v1/workflow-runs/{run.json()['data']['id']}/events/stream", headers=tenant.headers
    )
    events, comments = parse_sse(response.text)
    assert ": keep-alive" in comments
    assert events[-1]["event"] == "WORKFLOW_COMPLETED"
