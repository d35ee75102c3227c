"""Structured output on a thinking step (docs/providers.md, "Thinking"): Anthropic takes
`output_config.format` together with thinking, and refuses the forced tool_choice the final-answer
tool needs, so where native cannot be used a thinking step falls back to the prompt, and says why."""

from __future__ import annotations

import json

from stevora.testing.fake_llm import FakeLLMServer, anthropic_text
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow
from tests.integration.loop.test_loop_structured_output import ANSWER, TICKET_SCHEMA

THINKING = {"model": "claude-sonnet-4-5", "maxTokens": 4000, "thinking": {"budgetTokens": 2000}}


async def test_a_thinking_step_sends_output_config_format_with_thinking_and_its_answer_validates(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.anthropic.enqueue(anthropic_text(json.dumps(ANSWER)))
    result = await run_workflow(
        harness, workspace_id, llm_step(**THINKING, outputSchema=TICKET_SCHEMA, outputKey="ticket")
    )

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"ticket": ANSWER}
    (request,) = fake.anthropic.requests
    assert request.json["thinking"] == {"type": "enabled", "budget_tokens": 2000}
    assert request.json["output_config"]["format"]["type"] == "json_schema"
    assert "tool_choice" not in request.json
    (event,) = result.events_of("LLM_CALL_COMPLETED")
    assert event["structuredOutput"] == "native" and "structuredOutputFallback" not in event
    assert event["reasoningTokens"] > 0  # the fake thought first, and counted it


async def test_a_schema_native_mode_refuses_on_a_thinking_step_falls_back_to_the_prompt_not_the_tool(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    open_object = {"type": "object", "properties": {"tags": {"type": "object", "additionalProperties": True}}}
    fake.anthropic.enqueue(anthropic_text('{"tags": {"a": 1}}'))
    result = await run_workflow(harness, workspace_id, llm_step(**THINKING, outputSchema=open_object))

    # The fake answers 400 to a forced tool_choice with thinking on, as the API does.
    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": {"tags": {"a": 1}}}
    (request,) = fake.anthropic.requests
    assert "output_config" not in request.json
    assert "tools" not in request.json and "tool_choice" not in request.json
    assert "It must match this JSON Schema" in request.json["system"][0]["text"]
    (event,) = result.events_of("LLM_CALL_COMPLETED")
    assert event["structuredOutput"] == "prompt"
    fallback = event["structuredOutputFallback"]
    assert fallback.startswith("outputSchema.properties.tags.additionalProperties: strict mode needs")
    assert "thinking is on" in fallback and "no forced tool_choice" in fallback
