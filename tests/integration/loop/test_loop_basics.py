"""The tool loop through the real driver and PostgreSQL, with the offline scripted provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stevora.engine import commands
from stevora.llm.messages import LlmResponse, ToolCall, Usage
from stevora.llm.scripted_provider import ScriptedProvider
from tests.conftest import Harness, create_definition

ROOT = Path(__file__).resolve().parents[3]

# Every TOOL_CALL_* event has exactly one trace row and every trace row exactly one event.
CONSISTENCY_SQL = """
SELECT
  (SELECT count(*) FROM workflow_events e WHERE e.workflow_run_id = $1
     AND e.event_type IN ('TOOL_CALL_COMPLETED', 'TOOL_CALL_FAILED')
     AND NOT EXISTS (SELECT 1 FROM tool_trace t WHERE t.id = e.payload->>'toolTraceId'
                     AND t.status = CASE e.event_type WHEN 'TOOL_CALL_COMPLETED' THEN 'completed' ELSE 'failed' END))
  AS events_without_trace,
  (SELECT count(*) FROM tool_trace t WHERE t.workflow_run_id = $1
     AND (SELECT count(*) FROM workflow_events e WHERE e.workflow_run_id = $1
          AND e.event_type IN ('TOOL_CALL_COMPLETED', 'TOOL_CALL_FAILED') AND e.payload->>'toolTraceId' = t.id) <> 1)
  AS traces_without_one_event
"""


async def assert_trace_event_consistency(harness: Harness, run_id: str) -> None:
    row = await harness.rt.pool.fetchrow(CONSISTENCY_SQL, run_id)
    assert row["events_without_trace"] == 0 and row["traces_without_one_event"] == 0, dict(row)


async def test_research_agent_example_runs_with_scripted_provider(
    harness: Harness, workspace_id: str
) -> None:
    seen: list[dict[str, Any]] = []

    async def search(input: dict[str, Any]) -> list[dict[str, str]]:
        seen.append(input)
        return [{"title": "Refund policy"}]

    async def customer(input: dict[str, Any]) -> dict[str, Any]:
        seen.append(input)
        return {"plan": "team"}

    harness.tools.register("search_knowledge_base", search)
    harness.tools.register("get_customer_data", customer)
    spec = json.loads((ROOT / "examples" / "research-agent.json").read_text())
    spec["steps"][0]["model"] = "scripted"
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(
        harness.rt, workspace_id, def_id, {"question": "Refunds?", "customerId": "cus_42"}
    )
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert "Refund policy" in row["state"]["answer"]
    traces = await harness.rt.pool.fetch(
        "SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY sequence", run["id"]
    )
    assert [t["tool_name"] for t in traces] == ["search_knowledge_base", "get_customer_data"]
    assert all(t["status"] == "completed" for t in traces)
    assert traces[0]["idempotency_key"].endswith(":1:0")
    types = await harness.event_types(run["id"])
    assert types.count("LLM_CALL_COMPLETED") == 2 and types.count("TOOL_CALL_COMPLETED") == 2
    await assert_trace_event_consistency(harness, run["id"])


async def test_model_asking_for_tools_past_the_limit_fails_with_max_tool_rounds(
    harness: Harness, workspace_id: str
) -> None:
    calls = 0

    async def ping(input: dict[str, Any]) -> str:
        nonlocal calls
        calls += 1
        return "pong"

    harness.tools.register("ping", ping)
    turns = [
        LlmResponse(
            text=None,
            tool_calls=[ToolCall(f"c{i}", "ping", "{}")],
            usage=Usage(10, 5),
            model="m",
            finish_reason="tool_calls",
            response_id=None,
            provider="limit",
        )
        for i in range(4)
    ]
    harness.rt.providers.register("limit", ScriptedProvider(turns, name="limit"))
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "lim",
            "version": "1",
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "model": "x",
                    "provider": "limit",
                    "maxToolRounds": 2,
                    "messages": [{"role": "user", "content": "go"}],
                    "tools": [
                        {
                            "name": "ping",
                            "description": "p",
                            "parameters": {"type": "object", "properties": {}},
                        }
                    ],
                }
            ],
        },
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "FAILED", "COMPLETED")
    assert row["status"] == "FAILED" and row["error"]["code"] == "MAX_TOOL_ROUNDS"
    assert calls == 2  # the third request's tool was not executed
    llm_calls = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM llm_calls WHERE workflow_run_id = $1", run["id"]
    )
    assert llm_calls == 3
