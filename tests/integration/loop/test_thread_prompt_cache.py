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
from stevora.testing.fake_llm import FakeLLMServer
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
