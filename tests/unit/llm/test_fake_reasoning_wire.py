"""The fake server's reasoning answers are what the installed SDKs' own types describe: every
Responses stream event and body, and every Anthropic thinking stream event, validates against
the SDK's pydantic models (the SDKs build stream events without validating them, so this is
where a wrong field would show)."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from stevora.testing.fake_llm import anthropic_tool_use
from stevora.testing.fake_reasoning import anthropic_thinking_problem, validate_responses
from stevora.testing.fake_responses import responses_text, responses_tool_calls
from stevora.testing.fake_stream import anthropic_events, complete_body, responses_events

REQUEST = {
    "model": "o4-mini",
    "input": "q",
    "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": False}],
}


@pytest.mark.parametrize(
    "answer",
    [
        responses_tool_calls([("call_1", "f", '{"a": 1}'), ("call_2", "f", "{}")], reasoning="plan"),
        responses_text("the answer", reasoning="sum up"),
    ],
    ids=["tool-calls", "text"],
)
def test_responses_bodies_and_stream_events_validate_against_the_sdk_types(answer: object) -> None:
    body = complete_body(answer.body, REQUEST)  # type: ignore[attr-defined]
    Response.model_validate(body, strict=False)
    adapter = TypeAdapter(ResponseStreamEvent)
    events = responses_events(body, 3)
    parsed = [adapter.validate_python(json.loads(e.data)) for e in events]
    assert [p.type for p in parsed][:2] == ["response.created", "response.in_progress"]
    assert parsed[-1].type == "response.completed"
    assert [p.sequence_number for p in parsed] == list(range(len(parsed)))
    assert all(e.name == json.loads(e.data)["type"] for e in events)


def test_anthropic_thinking_answer_and_stream_validate_against_the_sdk_types() -> None:
    answer = anthropic_tool_use([("toolu_1", "f", {"a": 1})], thinking="plan it", redacted_thinking=True)
    assert answer.body is not None
    message = AnthropicMessage.model_validate(answer.body)
    assert [b.type for b in message.content] == ["thinking", "redacted_thinking", "tool_use"]
    assert message.usage.output_tokens_details is not None
    adapter = TypeAdapter(RawMessageStreamEvent)
    events = [
        adapter.validate_python(json.loads(e.data))
        for e in anthropic_events(answer.body, 2)
        if e.name != "ping"
    ]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "thinking_delta" in deltas and "signature_delta" in deltas


def test_the_fakes_refuse_what_the_apis_refuse() -> None:
    thinking = {"type": "enabled", "budget_tokens": 2048}
    assert "max_tokens" in (
        anthropic_thinking_problem({"thinking": thinking, "max_tokens": 2048, "messages": []}) or ""
    )
    assert "greater than or equal to 1024" in (
        anthropic_thinking_problem({"thinking": {"type": "enabled", "budget_tokens": 10}, "max_tokens": 4096})
        or ""
    )
    forced = {"thinking": thinking, "max_tokens": 4096, "tool_choice": {"type": "any"}, "messages": []}
    assert "forces tool use" in (anthropic_thinking_problem(forced) or "")
    loose = {
        "type": "function",
        "name": "f",
        "parameters": {"type": "object", "properties": {"a": {}}},
        "strict": True,
    }
    assert "Invalid schema" in (validate_responses({"model": "gpt-4o", "input": "q", "tools": [loose]}) or "")
    orphan = {"model": "gpt-4o", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}
    assert "No tool call found" in (validate_responses(orphan) or "")
    # A non-reasoning model needs no reasoning item before its calls.
    calls = [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    assert validate_responses({"model": "gpt-4o", "input": calls}) is None
    assert "required 'reasoning' item" in (validate_responses({"model": "o4-mini", "input": calls}) or "")
