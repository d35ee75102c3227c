"""A committed run is answered as created even when the broker refused its wake-up message, and
tool traces come back in (round, position in the model's answer) order."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from api_helpers import DefinitionFactory, Tenant

from stevora.engine.sweep import sweep_once


class BrokerDown(ConnectionError):
    pass


async def refuse(run_id: str, *, delay_ms: int = 0) -> None:
    """A dispatcher whose broker is down."""
    raise BrokerDown("connection to the broker was reset")


async def test_create_answers_201_when_the_publish_after_commit_fails_and_the_sweep_runs_it(
    client: httpx.AsyncClient,
    tenant: Tenant,
    define: DefinitionFactory,
    harness: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness.tasks.register("noop", lambda ctx: {"ok": True})
    definition_id = await define([{"type": "task", "name": "t", "handler": "noop"}])

    monkeypatch.setattr(harness.dispatcher, "dispatch", refuse)
    response = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )

    assert response.status_code == 201, response.text
    run_id = response.json()["data"]["id"]
    assert response.json()["data"]["status"] == "PENDING"
    stored = await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs WHERE id = $1", run_id)
    assert stored == 1

    # The message was only a hint: once the grace period is over the sweep dispatches the run.
    monkeypatch.undo()
    await asyncio.sleep(harness.rt.settings.undispatched_grace_s + 0.1)
    assert run_id in await sweep_once(harness.rt)
    row = await harness.wait_for_status(run_id, "COMPLETED")
    assert row["output"] == {}


async def test_retry_answers_200_when_the_publish_after_commit_fails(
    client: httpx.AsyncClient,
    tenant: Tenant,
    define: DefinitionFactory,
    harness: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(ctx: Any) -> None:
        raise RuntimeError("nope")

    harness.tasks.register("fail", fail)
    definition_id = await define(
        [{"type": "task", "name": "t", "handler": "fail", "retry": {"maxAttempts": 1}}]
    )
    created = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )
    run_id = created.json()["data"]["id"]
    await harness.wait_for_status(run_id, "FAILED")

    monkeypatch.setattr(harness.dispatcher, "dispatch", refuse)
    response = await client.post(f"/v1/workflow-runs/{run_id}/retry", headers=tenant.headers)
    assert response.status_code == 200, response.text
    assert response.json()["data"]["status"] in ("PENDING", "RUNNING")


async def test_tool_traces_are_listed_by_round_then_position_not_completion_order(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    async def slow_search(input: dict[str, Any]) -> list[str]:
        await asyncio.sleep(0.3)  # finishes, and commits, after the second call of its round
        return ["Refund policy"]

    async def customer(input: dict[str, Any]) -> dict[str, str]:
        return {"plan": "team"}

    harness.tools.register("search_knowledge_base", slow_search)
    harness.tools.register("get_customer_data", customer)
    definition_id = await define(
        [
            {
                "type": "llm",
                "name": "agent",
                "model": "scripted",
                "messages": [{"role": "user", "content": "{{input.question}}"}],
                "tools": [{"name": "search_knowledge_base"}, {"name": "get_customer_data"}],
                "parallelToolCalls": True,
            }
        ]
    )
    created = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition_id, "input": {"question": "Refunds?"}},
        headers=tenant.headers,
    )
    run_id = created.json()["data"]["id"]
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    committed = await harness.rt.pool.fetch(
        "SELECT tool_name FROM tool_trace WHERE workflow_run_id = $1 ORDER BY created_at", run_id
    )
    assert [t["tool_name"] for t in committed] == ["get_customer_data", "search_knowledge_base"]

    response = await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)
    assert response.status_code == 200
    listed = response.json()["data"]
    assert [(t["round"], t["sequence"], t["toolName"]) for t in listed] == [
        (1, 0, "search_knowledge_base"),
        (1, 1, "get_customer_data"),
    ]
