"""Provider-neutral message types: JSON round trips and helpers."""

from __future__ import annotations

import json

import pytest

from stevora.llm.messages import LlmRequest, LlmResponse, Message, ToolCall, ToolSpec, Usage


def test_messages_round_trip_through_json():
    messages = [
        Message.system("sys"),
        Message.user("hi"),
        Message.assistant("let me look", [ToolCall("call_1", "search", '{"q":"x"}')]),
        Message.tool_result("call_1", '{"error": "boom"}', name="search", is_error=True),
    ]
    restored = [Message.from_dict(json.loads(json.dumps(m.to_dict()))) for m in messages]
    assert restored == messages


def test_request_and_response_round_trip_through_json():
    request = LlmRequest(
        model="gpt-4o",
        messages=[Message.user("hi")],
        tools=[ToolSpec("search", "Search", {"type": "object"})],
        temperature=0.5,
        max_tokens=100,
        response_format="json",
        parallel_tool_calls=False,
        timeout_s=5.0,
        output_schema={"a": {"type": "string"}},
    )
    assert LlmRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    response = LlmResponse(
        None, [ToolCall("c", "n", "{}")], Usage(5, 6, 1, 2, 3), "gpt-4o-2024", "tool_calls", "id", "openai"
    )
    assert LlmResponse.from_dict(json.loads(json.dumps(response.to_dict()))) == response


def test_tool_calls_given_as_a_list_become_a_tuple():
    message = Message(role="assistant", tool_calls=[ToolCall("c", "n", "{}")])  # type: ignore[arg-type]
    assert message.tool_calls == (ToolCall("c", "n", "{}"),)
    hash(message)


def test_unknown_role_is_rejected():
    with pytest.raises(ValueError):
        Message(role="robot")  # type: ignore[arg-type]


def test_usage_adds_up_and_serialises():
    total = Usage(10, 2, cache_read_tokens=4) + Usage(5, 1, cache_write_tokens=3, reasoning_tokens=1)
    assert total == Usage(15, 3, 4, 3, 1)
    assert total.total_tokens == 18
    assert total.to_dict() == {
        "input_tokens": 15,
        "output_tokens": 3,
        "cache_read_tokens": 4,
        "cache_write_tokens": 3,
        "reasoning_tokens": 1,
    }


def test_response_becomes_the_assistant_turn():
    response = LlmResponse("t", [ToolCall("c", "n", "{}")], Usage(), "m", "tool_calls", None, "openai")
    assert response.to_message() == Message.assistant("t", [ToolCall("c", "n", "{}")])
