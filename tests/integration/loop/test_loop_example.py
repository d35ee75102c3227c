"""The reference spec's research-agent example, end to end through the real SDKs and the fake APIs;
parallel tool calls; the per-call idempotency key."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import examples.tools as example_tools
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from stevora.tools import ToolContext
from tests.conftest import Harness
from tests.integration.loop.conftest import (
    LoopRun,
    SdkProviders,
    anthropic_messages,
    llm_step,
    openai_messages,
    run_workflow,
    tool_def,
)
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency

ROOT = Path(__file__).resolve().parents[3]
QUESTION = {"question": "What is the refund policy?", "customerId": "cus_42"}
PROMPT = "What is the refund policy? (customer cus_42)"
ANSWER = "Annual plans are refundable within 30 days [kb-2]. Acme Corp is on the team plan."


def research_agent(model: str) -> dict[str, Any]:
    spec = json.loads((ROOT / "examples" / "research-agent.json").read_text())
    spec["steps"][0]["model"] = model
    return spec


def register_example_tools(harness: Harness) -> list[str]:
    """The example's real handlers (`examples/tools.py`), counting calls."""
    calls: list[str] = []

    async def search_knowledge_base(query: str, limit: int = 3) -> list[dict[str, str]]:
        calls.append("search_knowledge_base")
        return await example_tools.search_knowledge_base(query, limit)

    async def get_customer_data(customerId: str, ctx: ToolContext) -> dict[str, Any]:
        calls.append("get_customer_data")
        return await example_tools.get_customer_data(customerId, ctx)

    harness.tools.tool(search_knowledge_base)
    harness.tools.tool(get_customer_data)
    return calls


async def check_example_rows(result: LoopRun, provider: str, model: str, calls: list[str]) -> None:
    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"answer": ANSWER}
    assert sorted(calls) == ["get_customer_data", "search_knowledge_base"]  # each ran once
    step_run_id = result.step_runs[0]["id"]
    first, second = result.llm_calls
    assert [(c["round"], c["status"], c["provider"], c["model"]) for c in result.llm_calls] == [
        (1, "completed", provider, model),
        (2, "completed", provider, model),
    ]
    assert first["request"]["tools"] == ["search_knowledge_base", "get_customer_data"]
    assert [t["tool_name"] for t in result.traces] == ["search_knowledge_base", "get_customer_data"]
    kb, customer = result.traces
    assert [t["sequence"] for t in result.traces] == [0, 1]
    assert {t["llm_call_id"] for t in result.traces} == {first["id"]}
    assert all(t["status"] == "completed" and t["error"] is None for t in result.traces)
    assert kb["input_json"] == {"query": "refund policy", "limit": 2}
    assert [a["id"] for a in kb["output_json"]] == ["kb-2", "kb-1"]
    assert customer["output_json"]["lookedUpWith"] == f"{step_run_id}:1:1"
    assert [t["idempotency_key"] for t in result.traces] == [f"{step_run_id}:1:0", f"{step_run_id}:1:1"]
    types = result.event_types()
    assert types == [
        "WORKFLOW_STARTED",
        "STEP_STARTED",
        "LLM_CALL_COMPLETED",
        "TOOL_CALL_COMPLETED",
        "TOOL_CALL_COMPLETED",
        "LLM_CALL_COMPLETED",
        "STEP_COMPLETED",
        "WORKFLOW_COMPLETED",
    ]
    llm_events = result.events_of("LLM_CALL_COMPLETED")
    assert [e["llmCallId"] for e in llm_events] == [first["id"], second["id"]]
    assert llm_events[0]["toolCalls"] == ["search_knowledge_base", "get_customer_data"]
    tool_events = sorted(result.events_of("TOOL_CALL_COMPLETED"), key=lambda e: e["sequence"])
    assert [e["toolTraceId"] for e in tool_events] == [t["id"] for t in result.traces]
    output = await result.harness.rt.pool.fetchval("SELECT output FROM step_runs WHERE id = $1", step_run_id)
    assert output["rounds"] == 2 and output["toolRounds"] == 1 and output["provider"] == provider
    await assert_trace_event_consistency(result.harness, result.id)


async def test_research_agent_example_on_the_openai_api(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    calls = register_example_tools(harness)
    fake.openai.enqueue(
        openai_tool_calls(
            [
                ("call_kb", "search_knowledge_base", '{"query": "refund policy", "limit": 2}'),
                ("call_cus", "get_customer_data", '{"customerId": "cus_42"}'),
            ],
            model="gpt-4o",
        ),
        openai_text(ANSWER, model="gpt-4o"),
    )
    result = await run_workflow(harness, workspace_id, research_agent("gpt-4o")["steps"], QUESTION)
    await check_example_rows(result, "openai", "gpt-4o", calls)

    first, second = fake.openai.requests
    assert first.json["model"] == "gpt-4o"
    assert first.json["messages"] == [
        {"role": "system", "content": research_agent("gpt-4o")["steps"][0]["systemPrompt"]},
        {"role": "user", "content": PROMPT},
    ]
    assert [t["function"]["name"] for t in first.json["tools"]] == [
        "search_knowledge_base",
        "get_customer_data",
    ]
    assert first.json["parallel_tool_calls"] is True
    history = openai_messages(fake, 1)
    assert history[:2] == first.json["messages"]
    assert [c["id"] for c in history[2]["tool_calls"]] == ["call_kb", "call_cus"]
    assert history[2]["tool_calls"][0]["function"]["arguments"] == '{"query": "refund policy", "limit": 2}'
    assert [(m["role"], m["tool_call_id"]) for m in history[3:]] == [
        ("tool", "call_kb"),
        ("tool", "call_cus"),
    ]
    assert json.loads(history[3]["content"]) == result.traces[0]["output_json"]
    assert json.loads(history[4]["content"]) == result.traces[1]["output_json"]
    assert second.json["tools"] == first.json["tools"]


async def test_research_agent_example_on_the_anthropic_api(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    calls = register_example_tools(harness)
    model = "claude-haiku-4-5"
    fake.anthropic.enqueue(
        anthropic_tool_use(
            [
                ("toolu_kb", "search_knowledge_base", {"query": "refund policy", "limit": 2}),
                ("toolu_cus", "get_customer_data", {"customerId": "cus_42"}),
            ],
            text="Let me look that up.",
            model=model,
        ),
        anthropic_text(ANSWER, model=model),
    )
    spec = research_agent(model)
    result = await run_workflow(harness, workspace_id, spec["steps"], QUESTION)
    await check_example_rows(result, "anthropic", model, calls)

    first, second = fake.anthropic.requests
    # The system prompt as a text block carrying a prompt-cache breakpoint (docs/long-horizon.md).
    assert first.json["system"] == [
        {"type": "text", "text": spec["steps"][0]["systemPrompt"], "cache_control": {"type": "ephemeral"}}
    ]
    assert first.json["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}],
        }
    ]
    assert [t["name"] for t in first.json["tools"]] == ["search_knowledge_base", "get_customer_data"]
    assert first.json["tools"][0]["input_schema"] == spec["steps"][0]["tools"][0]["parameters"]
    assert "tool_choice" not in first.json  # parallel tool use stays allowed
    history = anthropic_messages(fake, 1)
    assert history[1]["role"] == "assistant"
    assert history[1]["content"][0] == {"type": "text", "text": "Let me look that up."}
    assert [(b["type"], b["id"], b["input"]) for b in history[1]["content"][1:]] == [
        ("tool_use", "toolu_kb", {"query": "refund policy", "limit": 2}),
        ("tool_use", "toolu_cus", {"customerId": "cus_42"}),
    ]
    results = history[2]["content"]
    assert history[2]["role"] == "user"
    assert [(b["type"], b["tool_use_id"]) for b in results] == [
        ("tool_result", "toolu_kb"),
        ("tool_result", "toolu_cus"),
    ]
    assert json.loads(results[0]["content"]) == result.traces[0]["output_json"]
    assert not any(b.get("is_error") for b in results)
    assert result.llm_calls[0]["response"]["text"] == "Let me look that up."
    assert second.json["system"] == first.json["system"]


async def test_parallel_tool_calls_run_concurrently_and_keep_the_models_order(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    spans: dict[str, tuple[float, float]] = {}

    async def nap(input: dict[str, Any]) -> dict[str, str]:
        start = time.perf_counter()
        await asyncio.sleep(input["seconds"])
        spans[input["label"]] = (start, time.perf_counter())
        return {"label": input["label"]}

    harness.tools.register("nap", nap)
    # "a" sleeps longest, so the calls finish in a different order than the model asked for them.
    fake.openai.enqueue(
        openai_tool_calls(
            [
                ("call_a", "nap", '{"label": "a", "seconds": 0.4}'),
                ("call_b", "nap", '{"label": "b", "seconds": 0.3}'),
                ("call_c", "nap", '{"label": "c", "seconds": 0.3}'),
            ]
        ),
        openai_text("All rested."),
    )
    step = llm_step(tools=[tool_def("nap", {"label": {"type": "string"}, "seconds": {"type": "number"}})])
    result = await run_workflow(harness, workspace_id, step)
    assert result.status == "COMPLETED", result.run["error"]

    wall = max(end for _, end in spans.values()) - min(start for start, _ in spans.values())
    assert wall < 0.7, f"tool calls ran one after another ({wall:.2f}s for 1.0s of sleeps)"
    assert sum(t["duration_ms"] for t in result.traces) >= 950
    assert [(t["sequence"], t["tool_call_id"], t["input_json"]["label"]) for t in result.traces] == [
        (0, "call_a", "a"),
        (1, "call_b", "b"),
        (2, "call_c", "c"),
    ]
    # Events follow completion order; the sequence in each still names the model's order.
    events = result.events_of("TOOL_CALL_COMPLETED")
    assert events[-1]["sequence"] == 0 and events[-1]["toolCallId"] == "call_a"
    assert fake.openai.requests[0].json["parallel_tool_calls"] is True
    tool_messages = [m for m in openai_messages(fake, 1) if m["role"] == "tool"]
    assert [(m["tool_call_id"], json.loads(m["content"])) for m in tool_messages] == [
        ("call_a", {"label": "a"}),
        ("call_b", {"label": "b"}),
        ("call_c", {"label": "c"}),
    ]
    await assert_trace_event_consistency(harness, result.id)


async def test_parallel_tool_calls_false_runs_calls_one_by_one(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    spans: list[tuple[float, float]] = []

    async def nap(input: dict[str, Any]) -> str:
        start = time.perf_counter()
        await asyncio.sleep(0.15)
        spans.append((start, time.perf_counter()))
        return "ok"

    harness.tools.register("nap", nap)
    fake.anthropic.enqueue(
        anthropic_tool_use([("toolu_1", "nap", {}), ("toolu_2", "nap", {})]),
        anthropic_text("done"),
    )
    step = llm_step(model="claude-haiku-4-5", parallelToolCalls=False, tools=[tool_def("nap")])
    result = await run_workflow(harness, workspace_id, step)
    assert result.status == "COMPLETED", result.run["error"]
    assert spans[1][0] >= spans[0][1]  # the second started after the first ended
    assert fake.anthropic.requests[0].json["tool_choice"] == {
        "type": "auto",
        "disable_parallel_tool_use": True,
    }
    assert [t["sequence"] for t in result.traces] == [0, 1]
    assert [e["sequence"] for e in result.events_of("TOOL_CALL_COMPLETED")] == [0, 1]
    await assert_trace_event_consistency(harness, result.id)


async def test_idempotency_key_is_step_run_round_and_call_index(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    seen: list[tuple[str, int, int, str]] = []

    async def charge(input: dict[str, Any], ctx: ToolContext) -> dict[str, str]:
        seen.append((ctx.idempotency_key, ctx.round, ctx.call_index, ctx.tool_call_id))
        return {"chargeId": f"ch_{ctx.idempotency_key}"}

    harness.tools.register("charge", charge)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "charge", '{"cents": 100}'), ("call_2", "charge", '{"cents": 200}')]),
        openai_tool_calls([("call_3", "charge", '{"cents": 300}')]),
        openai_text("Charged three times."),
    )
    step = llm_step(tools=[tool_def("charge", {"cents": {"type": "integer"}})])
    result = await run_workflow(harness, workspace_id, step)
    assert result.status == "COMPLETED", result.run["error"]
    step_run_id = result.step_runs[0]["id"]
    expected = [f"{step_run_id}:1:0", f"{step_run_id}:1:1", f"{step_run_id}:2:0"]
    assert sorted(seen) == [
        (expected[0], 1, 0, "call_1"),
        (expected[1], 1, 1, "call_2"),
        (expected[2], 2, 0, "call_3"),
    ]
    assert all(re.fullmatch(r"srun_[a-z0-9]+:\d+:\d+", key) for key in expected), expected
    assert [t["idempotency_key"] for t in result.traces] == expected
    assert [(t["round"], t["sequence"]) for t in result.traces] == [(1, 0), (1, 1), (2, 0)]
    by_round = {c["round"]: c["id"] for c in result.llm_calls}
    assert [t["llm_call_id"] for t in result.traces] == [by_round[1], by_round[1], by_round[2]]
    assert [m["content"] for m in openai_messages(fake, 2) if m["role"] == "tool"] == [
        json.dumps({"chargeId": f"ch_{key}"}) for key in expected
    ]
    assert result.event_types().count("TOOL_CALL_COMPLETED") == 3
    await assert_trace_event_consistency(harness, result.id)
