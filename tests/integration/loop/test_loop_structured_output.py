"""Native structured outputs through the real SDKs against the fakes (docs/providers.md,
"Structured outputs"): strict json_schema on Chat Completions, output_config.format on Anthropic,
the forced final-answer tool, and the fallbacks, each said on LLM_CALL_COMPLETED."""

from __future__ import annotations

import json
from typing import Any

from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow, tool_def
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency

TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "category": {"type": "string", "enum": ["bug", "billing", "other"]},
        "summary": {"type": "string", "minLength": 3},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "required": ["category", "summary", "tags"],
}
ANSWER = {"category": "billing", "summary": "Charged twice", "tags": ["refund"]}


async def test_an_output_schema_is_sent_as_strict_json_schema_on_chat_completions_and_its_answer_validates(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.openai.enqueue(openai_text(json.dumps(ANSWER)))
    result = await run_workflow(
        harness, workspace_id, llm_step(outputSchema=TICKET_SCHEMA, outputKey="ticket")
    )

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"ticket": ANSWER}
    (request,) = fake.openai.requests
    fmt = request.json["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["strict"] is True and fmt["json_schema"]["name"] == "answer"
    schema = fmt["json_schema"]["schema"]
    # Fixed up for strict mode: closed objects; keywords it refuses moved into the description.
    assert schema["additionalProperties"] is False
    assert "minLength" not in schema["properties"]["summary"]
    assert "minLength: 3" in schema["properties"]["summary"]["description"]
    assert "uniqueItems" not in schema["properties"]["tags"]
    # No instruction in the prompt: the provider holds the answer to the schema.
    assert [m["role"] for m in request.json["messages"]] == ["user"]
    (event,) = result.events_of("LLM_CALL_COMPLETED")
    assert event["structuredOutput"] == "native" and "structuredOutputFallback" not in event
    assert result.llm_calls[0]["response"]["structuredOutput"] == "native"
    await assert_trace_event_consistency(harness, result.id)


async def test_the_original_schema_still_checks_the_answer_after_native_mode(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    # minLength is not enforced by strict mode (moved to the description): the step's check is.
    fake.openai.enqueue(openai_text(json.dumps({**ANSWER, "summary": "no"})))
    result = await run_workflow(harness, workspace_id, llm_step(outputSchema=TICKET_SCHEMA))

    assert result.status == "FAILED" and result.run["error"]["code"] == "GUARDRAIL_FAILED"
    (event,) = result.events_of("GUARDRAIL_FAILED")
    assert event["violations"][0]["message"].startswith("summary: 'no' is too short")


async def test_anthropic_gets_output_config_format_and_its_answer_validates(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.anthropic.enqueue(anthropic_text(json.dumps(ANSWER)))
    step = llm_step(model="claude-haiku-4-5", outputSchema=TICKET_SCHEMA, outputKey="ticket")
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"ticket": ANSWER}
    (request,) = fake.anthropic.requests
    fmt = request.json["output_config"]["format"]
    assert fmt["type"] == "json_schema" and fmt["schema"]["additionalProperties"] is False
    assert "tools" not in request.json and "tool_choice" not in request.json
    assert result.events_of("LLM_CALL_COMPLETED")[0]["structuredOutput"] == "native"


async def test_tool_mode_forces_the_final_answer_tool_and_takes_its_arguments_as_the_answer(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.anthropic.enqueue(anthropic_tool_use([("toolu_1", "final_answer", ANSWER)]))
    step = llm_step(model="claude-haiku-4-5", outputSchema=TICKET_SCHEMA, structuredOutput="tool")
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": ANSWER}
    assert result.traces == []  # the final answer is not a tool call that runs
    (request,) = fake.anthropic.requests
    assert request.json["tool_choice"] == {"type": "tool", "name": "final_answer"}
    assert request.json["tools"][0]["name"] == "final_answer"
    assert request.json["tools"][0]["input_schema"]["properties"]["category"]["enum"] == [
        "bug",
        "billing",
        "other",
    ]
    assert "output_config" not in request.json
    assert result.events_of("LLM_CALL_COMPLETED")[0]["structuredOutput"] == "tool"


async def test_tool_mode_beside_other_tools_requires_a_tool_call_and_runs_the_others_first(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    seen: list[dict[str, Any]] = []

    async def lookup(input: dict[str, Any]) -> dict[str, Any]:
        seen.append(input)
        return {"plan": "pro"}

    harness.tools.register("lookup", lookup)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "lookup", '{"user":"ana"}')]),
        openai_tool_calls([("call_2", "final_answer", json.dumps(ANSWER))]),
    )
    step = llm_step(
        outputSchema=TICKET_SCHEMA,
        structuredOutput="tool",
        tools=[tool_def("lookup", {"user": {"type": "string"}}, ["user"])],
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": ANSWER} and seen == [{"user": "ana"}]
    first, second = (r.json for r in fake.openai.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup", "final_answer"]
    assert first["tool_choice"] == second["tool_choice"] == "required"
    assert "response_format" not in first
    assert [t["tool_name"] for t in result.traces] == ["lookup"]


async def test_a_schema_strict_mode_refuses_falls_back_to_the_tool_and_says_why(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    schema = {"type": "object", "properties": {"note": {"type": "string"}}}  # optional: not strict
    fake.openai.enqueue(openai_tool_calls([("call_1", "final_answer", '{"note":"hi"}')]))
    result = await run_workflow(harness, workspace_id, llm_step(outputSchema=schema))

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": {"note": "hi"}}
    (request,) = fake.openai.requests
    assert "response_format" not in request.json
    assert request.json["tool_choice"] == {"type": "function", "function": {"name": "final_answer"}}
    (event,) = result.events_of("LLM_CALL_COMPLETED")
    assert event["structuredOutput"] == "tool"
    assert event["structuredOutputFallback"].startswith(
        "outputSchema.properties.note: property 'note' is optional"
    )


async def test_prompt_mode_says_the_schema_in_the_prompt_and_re_prompts_on_a_wrong_answer(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.openai.enqueue(openai_text('{"category": "nope"}'), openai_text(json.dumps(ANSWER)))
    step = llm_step(
        outputSchema=TICKET_SCHEMA,
        structuredOutput="prompt",
        guardrails={"onFailure": "retry_with_feedback"},
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    first = fake.openai.requests[0].json
    assert "response_format" not in first and "tools" not in first
    assert first["messages"][0]["role"] == "system"
    assert '"enum":["bug","billing","other"]' in first["messages"][0]["content"]
    assert len(fake.openai.requests) == 2
    assert result.events_of("LLM_CALL_COMPLETED")[0]["structuredOutput"] == "prompt"


async def test_the_fake_refuses_a_strict_schema_the_real_api_refuses(
    fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    import openai

    client = openai.AsyncOpenAI(api_key="test", base_url=fake.openai_base_url, max_retries=0)
    try:
        bad = {"type": "object", "properties": {"x": {"type": "string"}}, "required": []}
        try:
            await client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "hi"}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": bad, "strict": True},
                },
            )
        except openai.BadRequestError as exc:
            assert "'additionalProperties' is required to be supplied and to be false" in str(exc)
        else:
            raise AssertionError("the fake accepted a strict schema without additionalProperties: false")
    finally:
        await client.close()


async def test_anthropic_takes_an_optional_property_natively(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    optional = {"type": "object", "properties": {"note": {"type": "string"}}}
    fake.anthropic.enqueue(anthropic_text('{"note": "hi"}'))
    result = await run_workflow(
        harness, workspace_id, llm_step(model="claude-haiku-4-5", outputSchema=optional)
    )

    assert result.status == "COMPLETED", result.run["error"]
    assert "output_config" in fake.anthropic.requests[0].json  # optional properties are fine there
    assert "structuredOutputFallback" not in result.events_of("LLM_CALL_COMPLETED")[0]


async def test_an_open_object_falls_back_to_the_tool_on_anthropic_and_says_why(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    open_object = {"type": "object", "properties": {"tags": {"type": "object", "additionalProperties": True}}}
    fake.anthropic.enqueue(anthropic_tool_use([("toolu_1", "final_answer", {"tags": {"a": 1}})]))
    result = await run_workflow(
        harness, workspace_id, llm_step(model="claude-haiku-4-5", outputSchema=open_object)
    )

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": {"tags": {"a": 1}}}
    (request,) = fake.anthropic.requests
    assert "output_config" not in request.json
    assert request.json["tool_choice"] == {"type": "tool", "name": "final_answer"}
    (event,) = result.events_of("LLM_CALL_COMPLETED")
    assert event["structuredOutput"] == "tool"
    assert event["structuredOutputFallback"] == (
        "outputSchema.properties.tags.additionalProperties: strict mode needs a closed object "
        "(additionalProperties: false)"
    )
