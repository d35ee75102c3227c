"""Threads through the real SDKs against the caching fake (issue 33): a second turn's request
starts with the first turn's last request, byte for byte (cache markers aside), and OpenAI's
requests of every turn carry the thread's id as `prompt_cache_key`, so the prefix is read from
the cache across turns."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stevora.engine import threads
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from stevora.testing.fake_prompt_cache import FakePromptCache, without_cache_markers
from tests.conftest import Harness, create_definition
from tests.integration.loop.conftest import SdkProviders
from tests.integration.loop.test_loop_prompt_cache import (
    LONG_SYSTEM,
    _agent,
    _register_lookup,
    _tool_rounds_then_answer,
)


async def _turn(harness: Harness, workspace_id: str, thread_id: str, content: str) -> None:
    sent = await threads.send(harness.rt, workspace_id, thread_id, content)
    row = await harness.wait_for_status(sent.run_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_the_next_turn_resends_the_last_turns_request_byte_for_byte(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, model: str
) -> None:
    _register_lookup(harness)
    fake.prompt_cache = cache = FakePromptCache()
    route = fake.openai if model.startswith("gpt") else fake.anthropic
    first_turn = _tool_rounds_then_answer(route.kind, 2)

    def respond(body: dict[str, Any]) -> Any:
        # Turn 2 (its message last): answer at once; turn 1: two tool rounds, then an answer.
        last = (body.get("messages") or [{}])[-1]
        text = last.get("content")
        if isinstance(text, list):
            text = " ".join(str(part.get("text", "")) for part in text if isinstance(part, dict))
        if "second question" in str(text):
            return first_turn({"messages": [{"role": "assistant"}] * 9})
        return first_turn(body)

    route.responder = respond
    step = _agent(
        model, messages=[{"role": "user", "content": "{{input.content}}"}], systemPrompt=LONG_SYSTEM
    )
    definition_id = await create_definition(
        harness.rt, workspace_id, {"name": f"chat-{route.kind}", "version": "1", "steps": [step]}
    )
    thread = await threads.create_thread(
        harness.rt, workspace_id, definition_id, metadata={}, state={}, on_active="reject"
    )
    await _turn(harness, workspace_id, thread.id, "First question: what do we know?")
    await asyncio.sleep(0)
    await _turn(harness, workspace_id, thread.id, "And a second question")

    bodies = [json.loads(r.raw) for r in route.requests]
    assert len(bodies) == 4  # turn 1: two tool rounds and an answer; turn 2: an answer
    last_of_first = without_cache_markers(bodies[2])["messages"]
    first_of_second = without_cache_markers(bodies[3])["messages"]
    assert first_of_second[: len(last_of_first)] == last_of_first
    assert len(first_of_second) == len(last_of_first) + 2  # the first turn's answer, the new message
    if route.kind == "openai":
        assert {b.get("prompt_cache_key") for b in bodies} == {thread.id}
        # The second turn's prefix (system prompt, the first turn's rounds) is read from the cache.
        assert cache.log[-1].read_tokens / cache.log[-1].prompt_tokens >= 0.9


def _two_rounds_per_turn(kind: str) -> Any:
    """Each turn: two `lookup` rounds after its user message, then an answer."""

    def respond(body: dict[str, Any]) -> Any:
        messages = body.get("messages") or []
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user" and _is_text(m))
        done = sum(1 for m in messages[last_user:] if m.get("role") == "assistant")
        if done >= 2:
            return openai_text("Noted.") if kind == "openai" else anthropic_text("Noted.")
        call = (f"c{len(messages)}", "lookup", {"topic": f"t{len(messages)}"})
        if kind == "openai":
            return openai_tool_calls([(call[0], call[1], json.dumps(call[2]))])
        return anthropic_tool_use([call])

    return respond


def _is_text(message: dict[str, Any]) -> bool:
    """A user message a person wrote (not Anthropic's tool results, sent as user messages)."""
    content = message.get("content")
    return isinstance(content, str) or not any(
        isinstance(p, dict) and p.get("type") == "tool_result" for p in content or ()
    )


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_a_history_over_the_window_fails_the_turn_or_uses_the_steps_context_strategy(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, model: str
) -> None:
    async def lookup(input: dict[str, Any]) -> dict[str, Any]:
        return {"topic": input["topic"], "text": f"{input['topic']}: " + "detail " * 400}

    harness.tools.register("lookup", lookup)
    fake.context_window_tokens = 2_500
    route = fake.openai if model.startswith("gpt") else fake.anthropic
    route.responder = _two_rounds_per_turn(route.kind)
    ends = {}
    for name, extra in [
        ("plain", {}),
        (
            "trimmed",
            {"context": {"maxInputTokens": 2_000, "strategy": "trim_tool_results", "keepLastRounds": 1}},
        ),
    ]:
        step = _agent(
            model,
            systemPrompt="Be brief.",
            messages=[{"role": "user", "content": "{{input.content}}"}],
            **extra,
        )
        definition_id = await create_definition(
            harness.rt, workspace_id, {"name": f"{name}-{route.kind}", "version": "1", "steps": [step]}
        )
        thread = await threads.create_thread(
            harness.rt, workspace_id, definition_id, metadata={}, state={}, on_active="reject"
        )
        await _turn(harness, workspace_id, thread.id, "Look up the first topic")  # fits the window
        sent = await threads.send(harness.rt, workspace_id, thread.id, "Now the second topic")
        ends[name] = await harness.wait_for_status(sent.run_id, "COMPLETED", "FAILED")
    assert ends["plain"]["status"] == "FAILED"
    assert ends["plain"]["error"]["code"] == "CONTEXT_TOO_LONG", ends["plain"]["error"]
    assert ends["trimmed"]["status"] == "COMPLETED", ends["trimmed"]["error"]
