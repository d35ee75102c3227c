"""Reasoning and thinking tokens in /metrics (`stevora_llm_tokens_total{kind="reasoning"}`) and on
the `chat` spans (`gen_ai.usage.reasoning.output_tokens`), for a Responses-API reasoning agent and
an Anthropic thinking agent, through the real SDKs against the fakes."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stevora.api import create_app
from stevora.settings import Settings
from stevora.testing.fake_llm import FakeLLMServer, anthropic_text, anthropic_tool_use
from stevora.testing.fake_responses import reasoning_agent_responder
from stevora.tools import ToolContext
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow
from tests.integration.observability.test_metrics import _scrape, _value


@pytest.mark.parametrize("kind", ["responses", "anthropic"])
async def test_reasoning_tokens_are_counted_in_metrics_and_on_each_chat_span(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    settings: Settings,
    spans: InMemorySpanExporter,
    kind: str,
) -> None:
    @harness.tools.tool
    async def lookup(round: int, ctx: ToolContext) -> str:
        """Look the round up."""
        return f"looked up {round}"

    if kind == "responses":
        fake.responses.responder = reasoning_agent_responder("lookup", 2)
        step = llm_step(model="o4-mini", api="responses", tools=["lookup"])
        labels = {"provider": "openai", "model": "o4-mini"}
    else:
        fake.anthropic.enqueue(
            anthropic_tool_use([("toolu_1", "lookup", {"round": 1})], thinking="round 1: look it up"),
            anthropic_text("done", thinking="all done, say so"),
        )
        step = llm_step(
            model="claude-sonnet-4-5", maxTokens=4000, thinking={"budgetTokens": 2000}, tools=["lookup"]
        )
        labels = {"provider": "anthropic", "model": "claude-sonnet-4-5"}
    transport = httpx.ASGITransport(app=create_app(settings, runtime=harness.rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://stevora.test") as client:
        before = await _scrape(client)
        result = await run_workflow(harness, workspace_id, step)
        assert result.status == "COMPLETED", result.run["error"]
        await asyncio.sleep(0.05)
        after = await _scrape(client)

    calls = sorted(result.llm_calls, key=lambda c: c["round"])
    reasoning = [c["reasoning_tokens"] for c in calls]
    assert len(calls) >= 2 and all(n > 0 for n in reasoning), reasoning
    grown = _value(after, "stevora_llm_tokens_total", **labels, kind="reasoning") - _value(
        before, "stevora_llm_tokens_total", **labels, kind="reasoning"
    )
    assert grown == sum(reasoning)
    chats = sorted(
        (s for s in spans.get_finished_spans() if s.name.startswith("chat ")), key=lambda s: s.start_time or 0
    )
    assert [(s.attributes or {})["gen_ai.usage.reasoning.output_tokens"] for s in chats] == reasoning
