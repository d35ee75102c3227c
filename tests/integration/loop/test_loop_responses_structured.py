"""The Responses API path's structured outputs and images through the real openai SDK against the
fake (docs/providers.md, "Structured outputs" and "Images and files"): `text.format` as a strict
json_schema, the forced final-answer function, the prompt form, the fallbacks said on
LLM_CALL_COMPLETED, and input / tool images as `input_image` parts."""

from __future__ import annotations

import base64
import json
from typing import Any

import openai

from stevora import Image
from stevora.testing.fake_llm import FakeLLMServer
from stevora.testing.fake_responses import responses_text, responses_tool_calls
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow, tool_def
from tests.integration.loop.test_loop_structured_output import ANSWER, TICKET_SCHEMA

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_an_output_schema_is_sent_as_a_strict_text_format_on_responses_and_its_answer_validates(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.responses.enqueue(responses_text(json.dumps(ANSWER)))
    step = llm_step(model="o4-mini", api="responses", outputSchema=TICKET_SCHEMA, outputKey="ticket")
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"ticket": ANSWER}
    (request,) = fake.responses.requests
    fmt = request.json["text"]["format"]
    assert {k: fmt[k] for k in ("type", "name", "strict")} == {
        "type": "json_schema",
        "name": "answer",
        "strict": True,
    }
    # The strict fix-ups of Chat Completions: a closed object, unsupported keywords described.
    assert fmt["schema"]["additionalProperties"] is False
    assert "minLength: 3" in fmt["schema"]["properties"]["summary"]["description"]
    assert [i.get("role") for i in request.json["input"]] == ["user"]  # no instruction needed
    assert "tools" not in request.json
    (event,) = result.events_of("LLM_CALL_COMPLETED")
    assert event["structuredOutput"] == "native" and "structuredOutputFallback" not in event
    assert result.llm_calls[0]["response"]["structuredOutput"] == "native"


async def test_responses_tool_mode_forces_the_final_answer_function_by_name(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.responses.enqueue(responses_tool_calls([("call_1", "final_answer", json.dumps(ANSWER))]))
    step = llm_step(model="o4-mini", api="responses", outputSchema=TICKET_SCHEMA, structuredOutput="tool")
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": ANSWER}
    assert result.traces == []  # the final answer is not a tool that runs
    (request,) = fake.responses.requests
    assert request.json["tool_choice"] == {"type": "function", "name": "final_answer"}
    (tool,) = request.json["tools"]
    assert tool["name"] == "final_answer" and tool["type"] == "function"
    assert "text" not in request.json
    assert result.events_of("LLM_CALL_COMPLETED")[0]["structuredOutput"] == "tool"


async def test_responses_tool_mode_beside_other_tools_requires_a_call_and_runs_the_others_first(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    seen: list[dict[str, Any]] = []

    async def lookup(input: dict[str, Any]) -> dict[str, Any]:
        seen.append(input)
        return {"plan": "pro"}

    harness.tools.register("lookup", lookup)
    fake.responses.enqueue(
        responses_tool_calls([("call_1", "lookup", '{"user":"ana"}')], reasoning="look it up"),
        responses_tool_calls([("call_2", "final_answer", json.dumps(ANSWER))], reasoning="answer"),
    )
    step = llm_step(
        model="o4-mini",
        api="responses",
        outputSchema=TICKET_SCHEMA,
        structuredOutput="tool",
        tools=[tool_def("lookup", {"user": {"type": "string"}}, ["user"])],
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": ANSWER} and seen == [{"user": "ana"}]
    first, second = (r.json for r in fake.responses.requests)
    assert [t["name"] for t in first["tools"]] == ["lookup", "final_answer"]
    assert first["tool_choice"] == second["tool_choice"] == "required"
    # The reasoning item of round 1 still goes back with its function call.
    assert [i.get("type") for i in second["input"]][1:3] == ["reasoning", "function_call"]


async def test_a_schema_strict_mode_refuses_falls_back_to_the_tool_on_responses_and_says_why(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    schema = {"type": "object", "properties": {"note": {"type": "string"}}}  # optional: not strict
    fake.responses.enqueue(responses_tool_calls([("call_1", "final_answer", '{"note":"hi"}')]))
    result = await run_workflow(
        harness, workspace_id, llm_step(model="o4-mini", api="responses", outputSchema=schema)
    )

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": {"note": "hi"}}
    (request,) = fake.responses.requests
    assert "text" not in request.json
    assert request.json["tool_choice"] == {"type": "function", "name": "final_answer"}
    (tool,) = request.json["tools"]
    assert tool["strict"] is False  # the schema as it is: strict mode would refuse it
    (event,) = result.events_of("LLM_CALL_COMPLETED")
    assert event["structuredOutput"] == "tool"
    assert event["structuredOutputFallback"].startswith(
        "outputSchema.properties.note: property 'note' is optional"
    )


async def test_responses_prompt_mode_says_the_schema_in_a_system_item(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.responses.enqueue(responses_text(json.dumps(ANSWER)))
    step = llm_step(model="o4-mini", api="responses", outputSchema=TICKET_SCHEMA, structuredOutput="prompt")
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    (request,) = fake.responses.requests
    assert "text" not in request.json and "tools" not in request.json
    system = request.json["input"][0]
    assert system["role"] == "system" and '"enum":["bug","billing","other"]' in system["content"]
    assert result.events_of("LLM_CALL_COMPLETED")[0]["structuredOutput"] == "prompt"


async def test_the_responses_fake_refuses_a_strict_text_format_the_real_api_refuses_and_holds_answers_to_it(
    fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    client = openai.AsyncOpenAI(api_key="test", base_url=fake.openai_base_url, max_retries=0)
    good = {
        "type": "object",
        "properties": {"x": {"type": "string"}},
        "required": ["x"],
        "additionalProperties": False,
    }
    try:
        for schema, said in (
            ({**good, "additionalProperties": True}, "'additionalProperties' is required"),
            ({**good, "required": []}, "Missing 'x'"),
            (
                {**good, "properties": {"x": {"type": "string", "minLength": 2}}},
                "'minLength' is not permitted",
            ),
        ):
            try:
                await client.responses.create(
                    model="o4-mini",
                    input="hi",
                    text={"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}},
                )
            except openai.BadRequestError as exc:
                assert said in str(exc) and "text.format" in str(exc)
            else:
                raise AssertionError(f"the fake accepted a strict schema the API refuses: {schema}")
        # A scripted answer that does not fit the schema is a mistake in the test: answered 500.
        fake.responses.enqueue(responses_text('{"y": 1}'))
        try:
            await client.responses.create(
                model="o4-mini",
                input="hi",
                text={"format": {"type": "json_schema", "name": "a", "schema": good, "strict": True}},
            )
        except openai.InternalServerError as exc:
            assert "does not match the request's strict schema" in str(exc)
        else:
            raise AssertionError("the fake answered JSON that does not fit the strict schema")
        fake.responses.enqueue(responses_text('{"x": "fits"}'))
        answer = await client.responses.create(
            model="o4-mini",
            input="hi",
            text={"format": {"type": "json_schema", "name": "a", "schema": good, "strict": True}},
        )
        assert json.loads(answer.output_text) == {"x": "fits"}
    finally:
        await client.close()


async def test_an_input_image_reaches_the_responses_api_as_an_input_image_part(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.responses.enqueue(responses_text("A login form."))
    step = llm_step(
        model="o4-mini",
        api="responses",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is on this screen?"},
                    {"type": "image", "mediaType": "image/png", "data": "{{input.screenshot}}"},
                ],
            }
        ],
    )
    result = await run_workflow(harness, workspace_id, step, {"screenshot": _b64(PNG)})

    assert result.status == "COMPLETED", result.run["error"]
    (request,) = fake.responses.requests
    (user,) = request.json["input"]
    assert user == {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is on this screen?"},
            {"type": "input_image", "detail": "auto", "image_url": f"data:image/png;base64,{_b64(PNG)}"},
        ],
    }


async def test_a_tool_image_reaches_the_responses_api_inside_its_function_call_output(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    async def screenshot(input: dict[str, Any]) -> list[Any]:
        return ["Here is the page.", Image(PNG, media_type="image/png")]

    harness.tools.register("screenshot", screenshot)
    fake.responses.enqueue(
        responses_tool_calls([("call_1", "screenshot", "{}")], reasoning="take a look"),
        responses_text("It shows a login form.", reasoning="seen it"),
    )
    step = llm_step(model="o4-mini", api="responses", tools=[tool_def("screenshot")])
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    second = fake.responses.requests[1].json
    (output,) = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert output["call_id"] == "call_1"
    texts = [p for p in output["output"] if p["type"] == "input_text"]
    images = [p for p in output["output"] if p["type"] == "input_image"]
    assert len(texts) == 1 and "Here is the page." in texts[0]["text"]
    assert images == [
        {"type": "input_image", "detail": "auto", "image_url": f"data:image/png;base64,{_b64(PNG)}"}
    ]
    # No follow-up user message: the API takes the image in the tool's output.
    assert [i.get("role") for i in second["input"] if "role" in i] == ["user"]


async def test_the_responses_fake_checks_image_parts_as_the_sdk_types_say(
    fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    client = openai.AsyncOpenAI(api_key="test", base_url=fake.openai_base_url, max_retries=0)
    image = f"data:image/png;base64,{_b64(PNG)}"
    try:
        for part, said in (
            ({"type": "input_image", "image_url": image}, "input[0].content[0].detail"),
            (
                {"type": "input_image", "detail": "auto", "image_url": "data:image/svg+xml;base64,PHN2Zz4="},
                "image_url",
            ),
            ({"type": "image_url", "image_url": {"url": image}}, "input[0].content[0].type"),
        ):
            try:
                await client.responses.create(model="gpt-4.1", input=[{"role": "user", "content": [part]}])
            except openai.BadRequestError as exc:
                assert said in str(exc), str(exc)
            else:
                raise AssertionError(f"the fake accepted {part}")
        # A function_call_output may hold image parts (no `detail` needed there).
        fake.responses.enqueue(responses_text("seen"))
        answer = await client.responses.create(
            model="gpt-4.1",
            input=[
                {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [{"type": "input_image", "image_url": image}],
                },
            ],
        )
        assert answer.output_text == "seen"
    finally:
        await client.close()
