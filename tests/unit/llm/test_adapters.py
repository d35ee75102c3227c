"""Request building of the SDK adapters (no network: only `build_kwargs`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from stevora.llm.anthropic_provider import AnthropicProvider, to_anthropic_messages
from stevora.llm.messages import LlmRequest, Message, ToolCall, ToolSpec
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.provider import JSON_INSTRUCTION

TOOL = ToolSpec("f", "F", {"type": "object", "properties": {"x": {"type": "integer"}}})


@pytest.fixture
async def openai_provider() -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider("test", "http://127.0.0.1:9/v1", max_retries=5, timeout_s=12.0)
    yield provider
    await provider.aclose()


@pytest.fixture
async def anthropic_provider() -> AsyncIterator[AnthropicProvider]:
    provider = AnthropicProvider("test", "http://127.0.0.1:9", default_max_tokens=321)
    yield provider
    await provider.aclose()


def test_openai_client_gets_the_configured_retries_and_timeout(openai_provider: OpenAIProvider):
    assert openai_provider.client.max_retries == 5
    assert openai_provider.client.timeout == 12.0


def test_openai_minimal_request_sends_no_optional_fields(openai_provider: OpenAIProvider):
    kwargs = openai_provider.build_kwargs(LlmRequest(model="gpt-4o", messages=[Message.user("hi")]))
    assert kwargs == {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def test_openai_empty_assistant_content_and_tool_result_shapes(openai_provider: OpenAIProvider):
    kwargs = openai_provider.build_kwargs(
        LlmRequest(
            model="gpt-4o",
            messages=[
                Message.assistant(None),
                Message.assistant(None, [ToolCall("c1", "f", '{"x":1}')]),
                Message.tool_result("c1", '{"ok":true}', is_error=True),
            ],
            tools=[TOOL, ToolSpec("g", "G", {})],
            output_schema={"a": {"type": "string"}},
        )
    )
    assert kwargs["messages"][0] == {"role": "assistant", "content": ""}
    assert kwargs["messages"][1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x":1}'}
    assert kwargs["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": '{"ok":true}'}
    assert kwargs["tools"][1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert "response_format" not in kwargs  # only an explicit JSON format turns JSON mode on


def test_openai_json_mode_makes_sure_the_prompt_mentions_json(openai_provider: OpenAIProvider):
    # OpenAI answers 400 to json_object mode unless "JSON" appears somewhere in the messages.
    plain = openai_provider.build_kwargs(
        LlmRequest(model="gpt-4o", messages=[Message.user("Summarise")], response_format="json")
    )
    assert plain["response_format"] == {"type": "json_object"}
    assert plain["messages"][0] == {"role": "system", "content": JSON_INSTRUCTION}
    said = openai_provider.build_kwargs(
        LlmRequest(model="gpt-4o", messages=[Message.user("Answer in JSON")], response_format="json")
    )
    assert said["messages"] == [{"role": "user", "content": "Answer in JSON"}]


def test_anthropic_always_sends_max_tokens_and_keeps_temperature_out_of_kwargs(
    anthropic_provider: AnthropicProvider,
):
    kwargs = anthropic_provider.build_kwargs(
        LlmRequest(model="claude-haiku-4-5", messages=[Message.user("hi")], temperature=0.0)
    )
    assert kwargs["max_tokens"] == 321
    assert "temperature" not in kwargs
    assert kwargs["extra_body"] == {"temperature": 0.0}
    assert "tool_choice" not in kwargs and "system" not in kwargs


def test_anthropic_turns_are_merged_with_tool_results_first():
    system, turns = to_anthropic_messages(
        [
            Message.system("one"),
            Message.user("a"),
            Message.user("b"),
            Message.assistant("thinking", [ToolCall("t1", "f", "{}"), ToolCall("t2", "f", "not json")]),
            Message.user("note before results"),
            Message.tool_result("t1", "r1"),
            Message.tool_result("t2", "", is_error=True),
            Message.system("two"),
            Message.assistant(""),
        ]
    )
    assert system == "one\n\ntwo"
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "thinking"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "f", "input": {"raw": "not json"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "r1"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "", "is_error": True},
                {"type": "text", "text": "note before results"},
            ],
        },
    ]
