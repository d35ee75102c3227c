"""The tool loop sends the step's toolChoice on the first model call of a visit, `auto` after it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from stevora.engine import commands
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.openai_provider import OpenAIProvider
from stevora.testing.fake_llm import FakeLLMServer, scripted_responder
from tests.conftest import Harness, create_definition

TOOLS = [
    {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {}}},
    {"name": "get_time", "description": "Time", "parameters": {"type": "object", "properties": {}}},
]


@pytest.fixture
async def sdk_providers(harness: Harness, fake_llm: FakeLLMServer) -> AsyncIterator[None]:
    oa = openai.AsyncOpenAI(
        api_key="test", base_url=fake_llm.openai_base_url, max_retries=0, _strict_response_validation=True
    )
    an = anthropic.AsyncAnthropic(
        api_key="test",
        base_url=fake_llm.anthropic_base_url,
        max_retries=0,
        open_telemetry=False,
        _strict_response_validation=True,
    )
    harness.rt.providers.register("openai", OpenAIProvider("test", client=oa))
    harness.rt.providers.register("anthropic", AnthropicProvider("test", client=an))
    fake_llm.openai.responder = scripted_responder("openai")
    fake_llm.anthropic.responder = scripted_responder("anthropic")
    calls: list[str] = []
    for name in ("get_weather", "get_time"):

        async def handler(input: dict[str, Any], _name: str = name) -> str:
            calls.append(_name)
            return f"{_name} ok"

        harness.tools.register(name, handler)
    yield
    await oa.close()
    await an.close()


async def _run(harness: Harness, workspace_id: str, model: str, tool_choice: Any) -> dict[str, Any]:
    step = {
        "type": "llm",
        "name": "agent",
        "model": model,
        "messages": [{"role": "user", "content": "What now?"}],
        "tools": TOOLS,
        "toolChoice": tool_choice,
    }
    def_id = await create_definition(
        harness.rt, workspace_id, {"name": "tc", "version": "1", "steps": [step]}
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    traces = await harness.rt.pool.fetch(
        "SELECT tool_name FROM tool_trace WHERE workflow_run_id = $1", run["id"]
    )
    calls = await harness.rt.pool.fetch(
        "SELECT request FROM llm_calls WHERE workflow_run_id = $1 ORDER BY round", run["id"]
    )
    return {
        "tools": [t["tool_name"] for t in traces],
        "stored": [c["request"].get("toolChoice") for c in calls],
    }


async def test_named_tool_choice_forces_the_first_call_and_later_rounds_are_auto(
    harness: Harness, workspace_id: str, fake_llm: FakeLLMServer, sdk_providers: None
) -> None:
    result = await _run(harness, workspace_id, "gpt-4o-mini", {"name": "get_time"})

    assert result["tools"] == ["get_time"]
    sent = [r.json.get("tool_choice") for r in fake_llm.openai.requests]
    assert sent == [{"type": "function", "function": {"name": "get_time"}}, None]
    assert result["stored"] == [{"name": "get_time"}, None], "the trace records what the first call was told"


async def test_required_on_anthropic_binds_only_the_first_call_so_it_cannot_loop(
    harness: Harness, workspace_id: str, fake_llm: FakeLLMServer, sdk_providers: None
) -> None:
    result = await _run(harness, workspace_id, "claude-haiku-4-5", "required")

    assert sorted(result["tools"]) == ["get_time", "get_weather"]
    sent = [r.json.get("tool_choice") for r in fake_llm.anthropic.requests]
    assert sent == [{"type": "any"}, None]
