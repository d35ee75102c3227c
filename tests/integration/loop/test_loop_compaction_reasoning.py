"""The `compact` strategy on a Responses-API reasoning step and on an Anthropic thinking step
(docs/long-horizon.md): the summary call goes through the step's API, carries no reasoning items
or thinking, and every later round (kept rounds' reasoning included) is accepted by the fakes,
which refuse a missing reasoning item or thinking block."""

from __future__ import annotations

import json
from typing import Any

from stevora.testing.fake_llm import FakeLLMServer, FakeResponse, anthropic_text, anthropic_tool_use
from stevora.testing.fake_responses import responses_text, responses_tool_calls
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, run_workflow
from tests.integration.loop.test_loop_compaction import SUMMARY, _agent, is_compaction
from tests.integration.loop.test_loop_prompt_cache import _register_bulky


def _is_responses_compaction(body: dict[str, Any]) -> bool:
    items = body["input"]
    return (
        not body.get("tools")
        and len(items) == 1
        and str(items[0].get("content", "")).startswith("<conversation>")
    )


async def test_compact_on_a_responses_api_reasoning_step(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    _register_bulky(harness)
    fake.context_window_tokens = 2_500  # the fake counts the prompt's tokens (and refuses more)
    answered: list[int] = []

    def respond(body: dict[str, Any]) -> FakeResponse:
        if _is_responses_compaction(body):
            return responses_text(SUMMARY, model=body["model"])
        answered.append(1)
        done = len(answered) - 1
        if done >= 6:
            return responses_text("All findings are in.", reasoning="done", model=body["model"])
        call = (f"call_{done}", "lookup", json.dumps({"topic": f"t{done}"}))
        return responses_tool_calls([call], reasoning=f"look up t{done}", model=body["model"])

    fake.responses.responder = respond
    result = await run_workflow(
        harness, workspace_id, _agent("o4-mini", api="responses", reasoning={"effort": "low"})
    )

    assert result.status == "COMPLETED", result.run["error"]
    assert fake.openai.requests == []  # the summary went through the step's API, not Chat Completions
    bodies = [r.json for r in fake.responses.requests]
    compactions = [b for b in bodies if _is_responses_compaction(b)]
    assert len(compactions) == len(result.events_of("CONTEXT_COMPACTED")) >= 1
    for body in compactions:  # one user item, no tools, no reasoning items to send back
        assert [i.get("role") for i in body["input"]] == ["user"]
        assert body["store"] is False and body["reasoning"] == {"effort": "low"}
    loop = [b for b in bodies if not _is_responses_compaction(b)]
    assert len(loop) == 7
    last = loop[-1]
    assert SUMMARY in json.dumps(last["input"])
    # The kept round still goes back with its reasoning item before its call (the fake checks it).
    kinds = [i.get("type") for i in last["input"]]
    assert kinds[kinds.index("function_call") - 1] == "reasoning"


async def test_compact_on_an_anthropic_thinking_step(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    _register_bulky(harness)
    fake.context_window_tokens = 2_500
    answered: list[int] = []

    def respond(body: dict[str, Any]) -> FakeResponse:
        if is_compaction(body):
            return anthropic_text(SUMMARY)
        answered.append(1)
        done = len(answered) - 1
        if done >= 6:
            return anthropic_text("All findings are in.", thinking="all done")
        return anthropic_tool_use(
            [(f"toolu_{done}", "lookup", {"topic": f"t{done}"})], thinking=f"look up t{done}"
        )

    fake.anthropic.responder = respond
    step = _agent("claude-sonnet-4-5", maxTokens=4000, thinking={"budgetTokens": 2000})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    bodies = [r.json for r in fake.anthropic.requests]
    compactions = [b for b in bodies if is_compaction(b)]
    assert len(compactions) == len(result.events_of("CONTEXT_COMPACTED")) >= 1
    for body in compactions:  # thinking off for the summary; its max_tokens is the step's
        assert "thinking" not in body and body["max_tokens"] == 4000
    loop = [b for b in bodies if not is_compaction(b)]
    assert len(loop) == 7 and all(b["thinking"]["budget_tokens"] == 2000 for b in loop)
    # After a compaction the kept tool-use turn still starts with its signed thinking block
    # (the fake answers 400 otherwise).
    last = loop[-1]
    assert SUMMARY in json.dumps(last["messages"])
    assistant = [m for m in last["messages"] if m["role"] == "assistant"]
    assert assistant and all(m["content"][0]["type"] == "thinking" for m in assistant)
