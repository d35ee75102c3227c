"""LLM calls, tool traces and cost endpoints, over rows written the way the tool loop writes them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_helpers import Conforms, DefinitionFactory, Tenant

from stevora.ids import new_id


async def _run_with_llm_rows(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> tuple[str, dict[str, str]]:
    """A completed run of two steps, with llm_calls and tool_trace rows inserted for them."""
    harness.tasks.register("noop", lambda ctx: None)
    definition_id = await define(
        [
            {"type": "task", "name": "research", "handler": "noop"},
            {"type": "task", "name": "summarize", "handler": "noop"},
        ]
    )
    run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers)
    run_id: str = run.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")
    steps = {
        r["step_name"]: r["id"]
        for r in await harness.rt.pool.fetch(
            "SELECT id, step_name FROM step_runs WHERE workflow_run_id = $1", run_id
        )
    }
    calls = [
        # (step, round, model, provider, status, in, out, cost, seconds offset)
        ("research", 1, "gpt-4o", "openai", "completed", 245, 312, 0.0087, 0),
        ("research", 2, "gpt-4o", "openai", "completed", 400, 50, 0.0015, 1),
        ("summarize", 1, "claude-sonnet-4-20250514", "anthropic", "failed", 0, 0, 0.0, 2),
        ("summarize", 1, "gpt-4o-mini", "openai", "completed", 1000, 200, 0.00027, 3),
    ]
    ids: dict[str, str] = {}
    for step, rnd, model, provider, status, tin, tout, cost, offset in calls:
        call_id = new_id("llm")
        ids[f"{step}:{rnd}:{model}"] = call_id
        await harness.rt.pool.execute(
            "INSERT INTO llm_calls (id, workflow_run_id, step_run_id, step_name, round, provider, model, "
            "status, request, response, input_tokens, output_tokens, cost_usd, duration_ms, finish_reason, "
            "error, created_at) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 12.5, $14, $15, "
            "now() + make_interval(secs => $16))",
            call_id, run_id, steps[step], step, rnd, provider, model, status,
            {"messages": [{"role": "user", "content": "q"}]},
            None if status == "failed" else {"content": "a"},
            tin, tout, cost,
            None if status == "failed" else "stop",
            {"code": "LLM_PROVIDER_ERROR", "message": "overloaded"} if status == "failed" else None,
            float(offset),
        )  # fmt: skip
    call = ids["research:1:gpt-4o"]
    for seq, (name, status) in enumerate([("search_kb", "completed"), ("get_customer", "failed")]):
        await harness.rt.pool.execute(
            "INSERT INTO tool_trace (id, workflow_run_id, step_run_id, llm_call_id, round, sequence, "
            "tool_call_id, tool_name, input_json, output_json, status, error, error_code, duration_ms, "
            "idempotency_key) "
            "VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $8, $9, $10, $11, $12, 3.5, $13)",
            new_id("tt"), run_id, steps["research"], call, seq, f"call_{seq}", name, {"query": "x"},
            {"hits": 2} if status == "completed" else None, status,
            None if status == "completed" else "boom", None if status == "completed" else "TOOL_ERROR",
            f"{steps['research']}:1:{seq}",
        )  # fmt: skip
    return run_id, steps


async def test_llm_calls_are_listed_in_order_and_filtered_by_step(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, conforms: Conforms
) -> None:
    run_id, steps = await _run_with_llm_rows(client, tenant, define, harness)
    response = await client.get(f"/v1/workflow-runs/{run_id}/llm-calls", headers=tenant.headers)
    assert response.status_code == 200
    conforms(response, "GET", "/v1/workflow-runs/{run_id}/llm-calls")
    calls = response.json()["data"]
    assert [(c["stepName"], c["round"], c["model"]) for c in calls] == [
        ("research", 1, "gpt-4o"),
        ("research", 2, "gpt-4o"),
        ("summarize", 1, "claude-sonnet-4-20250514"),
        ("summarize", 1, "gpt-4o-mini"),
    ]
    first = calls[0]
    assert first["stepRunId"] == steps["research"] and first["provider"] == "openai"
    assert first["request"] == {"messages": [{"role": "user", "content": "q"}]} and first["response"] == {
        "content": "a"
    }
    assert (first["inputTokens"], first["outputTokens"], first["costUsd"]) == (245, 312, 0.0087)
    assert first["cacheReadTokens"] == 0 and first["durationMs"] == 12.5 and first["finishReason"] == "stop"
    assert calls[2]["status"] == "failed" and calls[2]["error"]["code"] == "LLM_PROVIDER_ERROR"
    only = (
        await client.get(f"/v1/workflow-runs/{run_id}/llm-calls?stepName=summarize", headers=tenant.headers)
    ).json()
    assert [c["model"] for c in only["data"]] == ["claude-sonnet-4-20250514", "gpt-4o-mini"]


async def test_tool_traces_are_listed_and_filtered_by_step_name(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, conforms: Conforms
) -> None:
    run_id, steps = await _run_with_llm_rows(client, tenant, define, harness)
    response = await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)
    conforms(response, "GET", "/v1/workflow-runs/{run_id}/tool-traces")
    traces = response.json()["data"]
    assert [(t["toolName"], t["sequence"], t["status"]) for t in traces] == [
        ("search_kb", 0, "completed"),
        ("get_customer", 1, "failed"),
    ]
    ok, failed = traces
    assert ok["inputJson"] == {"query": "x"} and ok["outputJson"] == {"hits": 2} and ok["error"] is None
    assert failed["error"] == "boom" and failed["errorCode"] == "TOOL_ERROR" and failed["outputJson"] is None
    assert ok["idempotencyKey"] == f"{steps['research']}:1:0" and ok["toolCallId"] == "call_0"
    url = f"/v1/workflow-runs/{run_id}/tool-traces?stepName="
    assert len((await client.get(url + "research", headers=tenant.headers)).json()["data"]) == 2
    assert (await client.get(url + "summarize", headers=tenant.headers)).json()["data"] == []


async def test_run_cost_totals_are_the_sums_of_its_calls(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any, conforms: Conforms
) -> None:
    run_id, _ = await _run_with_llm_rows(client, tenant, define, harness)
    response = await client.get(f"/v1/workflow-runs/{run_id}/cost", headers=tenant.headers)
    assert response.status_code == 200
    conforms(response, "GET", "/v1/workflow-runs/{run_id}/cost")
    cost = response.json()["data"]
    assert cost["workflowRunId"] == run_id
    assert cost["totalInputTokens"] == 1645 and cost["totalOutputTokens"] == 562
    assert cost["totalCostUsd"] == pytest.approx(0.0087 + 0.0015 + 0.00027)
    assert cost["totalCostUsd"] == pytest.approx(sum(c["costUsd"] for c in cost["calls"]))
    assert set(cost["calls"][0]) == {
        "stepName",
        "model",
        "inputTokens",
        "outputTokens",
        "costUsd",
        "createdAt",
        "status",
    }
    assert [c["status"] for c in cost["calls"]] == ["completed", "completed", "failed", "completed"]


async def test_cost_summary_aggregates_the_workspace_by_model_and_time(
    client: httpx.AsyncClient,
    tenant: Tenant,
    other_tenant: Tenant,
    define: DefinitionFactory,
    harness: Any,
    conforms: Conforms,
) -> None:
    await _run_with_llm_rows(client, tenant, define, harness)
    await _run_with_llm_rows(client, tenant, define, harness)
    await _run_with_llm_rows(client, other_tenant, lambda *a, **k: define(*a, **k, as_=other_tenant), harness)
    response = await client.get("/v1/cost/summary", headers=tenant.headers)
    conforms(response, "GET", "/v1/cost/summary")
    summary = response.json()["data"]
    assert summary["from"] is None and summary["to"] is None
    assert summary["runCount"] == 2 and summary["callCount"] == 8
    assert summary["totalInputTokens"] == 2 * 1645 and summary["totalOutputTokens"] == 2 * 562
    assert summary["totalCostUsd"] == pytest.approx(2 * (0.0087 + 0.0015 + 0.00027))
    by_model = {m["model"]: m for m in summary["byModel"]}
    assert by_model["gpt-4o"] == {
        "model": "gpt-4o", "provider": "openai", "calls": 4, "inputTokens": 1290, "outputTokens": 724,
        "costUsd": pytest.approx(2 * 0.0102),
    }  # fmt: skip
    assert by_model["claude-sonnet-4-20250514"]["calls"] == 2
    future = (await client.get("/v1/cost/summary?from=2999-01-01T00:00:00Z", headers=tenant.headers)).json()[
        "data"
    ]
    assert (
        future["callCount"] == 0 and future["byModel"] == [] and future["from"] == "2999-01-01T00:00:00.000Z"
    )
    past = (
        await client.get("/v1/cost/summary?from=2000-01-01&to=2999-01-01", headers=tenant.headers)
    ).json()["data"]
    assert past["callCount"] == 8 and past["to"] == "2999-01-01T00:00:00.000Z"


async def test_cost_summary_rejects_a_bad_date(client: httpx.AsyncClient, tenant: Tenant) -> None:
    for query in ("from=yesterday", "to=2026-13-01"):
        response = await client.get(f"/v1/cost/summary?{query}", headers=tenant.headers)
        assert response.status_code == 400
        assert response.json()["error"]["details"]["errors"][0]["path"] == query.split("=")[0]
