"""Reasoning items and thinking blocks: kept through the stored row, mapped onto each API's wire
form in the right place, and only to the API that wrote them (no network)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pydantic
import pytest

from stevora.definitions import LlmStep
from stevora.engine.steps.llm_state import response_message
from stevora.llm import openai_responses
from stevora.llm.anthropic_provider import AnthropicProvider, thinking_item, to_anthropic_messages
from stevora.llm.messages import LlmRequest, LlmResponse, Message, ReasoningItem, ToolCall, ToolSpec, Usage
from stevora.llm.transcript import prepare_transcript
from stevora.ui.queries import thinking_texts

THINKING = thinking_item("let me think \u00e9 \ud800", "sig==")
REDACTED = ReasoningItem.of("anthropic", {"type": "redacted_thinking", "data": "opaque"})
OPENAI_ITEM = ReasoningItem.of(
    "openai_responses",
    {
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "plan"}],
        "type": "reasoning",
        "encrypted_content": "enc",
    },
)
CALL = ToolCall("call_1", "lookup", '{"q":"a"}')


def test_a_reasoning_item_survives_the_stored_row_byte_for_byte() -> None:
    response = LlmResponse("hi", [CALL], Usage(), "m", "tool_calls", "r1", "anthropic", [THINKING, REDACTED])
    # What the loop stores (`response.reasoning` as [{"kind", "data"}]) through a JSON column and back.
    stored = json.loads(
        json.dumps(
            {
                "text": "hi",
                "toolCalls": [CALL.to_dict()],
                "reasoning": [r.to_dict() for r in response.reasoning],
            }
        )
    )
    rebuilt = response_message(stored)
    assert rebuilt.reasoning == (THINKING, REDACTED)
    assert rebuilt.reasoning[0].data == THINKING.data and THINKING.data.isascii()  # storable as it is
    assert rebuilt.reasoning[0].item()["thinking"] == "let me think \u00e9 \ud800"
    assert LlmResponse.from_dict(response.to_dict()) == response
    assert Message.from_dict(response.to_message().to_dict()) == response.to_message()
    hash(response.to_message())  # still hashable


def test_stored_reasoning_that_is_not_what_stevora_writes_is_left_out() -> None:
    stored = [
        {"kind": "anthropic", "data": {"type": "thinking"}},  # not a string
        {"kind": "elsewhere", "data": "{}"},  # an unknown kind
        {"kind": "anthropic", "data": "not json"},
        "junk",
        THINKING.to_dict(),
    ]
    turn = response_message({"text": None, "toolCalls": [CALL.to_dict()], "reasoning": stored})
    assert [r.kind for r in turn.reasoning] == ["anthropic", "anthropic"]
    _, messages = to_anthropic_messages([Message.user("q"), turn, Message.tool_result("call_1", "x")])
    assert [b["type"] for b in messages[1]["content"]] == [
        "thinking",
        "tool_use",
    ]  # the broken one is not sent


def test_transcript_repair_keeps_the_reasoning_of_a_turn_whose_ids_it_renames() -> None:
    turn = Message.assistant(None, [ToolCall("bad id!", "lookup", "{}")], [THINKING])
    repaired = prepare_transcript(
        [Message.user("q"), turn, Message.tool_result("bad id!", "x")], provider_name="anthropic"
    )
    assert repaired[1].tool_calls[0].id != "bad id!" and repaired[1].reasoning == (THINKING,)


def test_anthropic_turn_starts_with_its_own_thinking_blocks_only() -> None:
    turn = Message.assistant("checking", [CALL], [THINKING, OPENAI_ITEM, REDACTED])
    _, messages = to_anthropic_messages([Message.user("q"), turn, Message.tool_result("call_1", "x")])
    blocks = messages[1]["content"]
    assert [b["type"] for b in blocks] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert blocks[0] == {"type": "thinking", "thinking": "let me think \u00e9 \ud800", "signature": "sig=="}


async def test_anthropic_thinking_request_sets_the_budget_and_leaves_temperature_out() -> None:
    provider = AnthropicProvider("test", "http://127.0.0.1:9", default_max_tokens=321)
    try:
        request = LlmRequest(
            model="claude-sonnet-4-5",
            messages=[Message.user("q")],
            temperature=0.2,
            thinking_budget_tokens=2000,
        )
        kwargs = provider.build_kwargs(request)
        assert kwargs["thinking"] == {"type": "enabled", "budget_tokens": 2000}
        assert kwargs["max_tokens"] == 2321 and "extra_body" not in kwargs
        plain = provider.build_kwargs(dataclasses.replace(request, thinking_budget_tokens=None))
        assert (
            "thinking" not in plain
            and plain["max_tokens"] == 321
            and plain["extra_body"] == {"temperature": 0.2}
        )
    finally:
        await provider.aclose()


def test_responses_input_puts_reasoning_before_its_function_calls_and_drops_other_kinds() -> None:
    messages = [
        Message.system("sys"),
        Message.user("q"),
        Message.assistant("let me see", [CALL, ToolCall("call_2", "lookup", "{}")], [OPENAI_ITEM, THINKING]),
        Message.tool_result("call_1", "one"),
        Message.tool_result("call_2", "two"),
    ]
    items = openai_responses.input_items(messages)
    assert items == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        OPENAI_ITEM.item(),
        {"role": "assistant", "content": "let me see"},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q":"a"}'},
        {"type": "function_call", "call_id": "call_2", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": "two"},
    ]


def test_responses_input_gives_the_items_after_a_reasoning_item_their_ids() -> None:
    ids = ReasoningItem.of("openai_item_ids", {"message": "msg_9", "calls": {"call_1": "fc_9"}})
    turn = Message.assistant("checking", [CALL], [OPENAI_ITEM, ids])
    items = openai_responses.input_items([Message.user("q"), turn, Message.tool_result("call_1", "x")])
    assert items[1:4] == [
        OPENAI_ITEM.item(),
        {
            "type": "message",
            "id": "msg_9",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "checking", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_9",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"q":"a"}',
        },
    ]
    assert thinking_texts([ids.to_dict()]) == []  # ids are never shown as reasoning


def test_responses_request_is_stateless_and_asks_for_encrypted_reasoning() -> None:
    tool = ToolSpec("lookup", "L", {"type": "object", "properties": {}, "additionalProperties": False})
    kwargs = openai_responses.build_kwargs(
        LlmRequest(
            model="o4-mini",
            messages=[Message.user("q")],
            tools=[tool],
            tool_choice="none",
            reasoning_effort="high",
        )
    )
    assert kwargs["store"] is False and kwargs["include"] == ["reasoning.encrypted_content"]
    assert kwargs["reasoning"] == {"effort": "high"}
    assert kwargs["tool_choice"] == "none" and kwargs["tools"][0]["strict"] is True


async def test_chat_completions_sends_the_reasoning_effort_and_no_reasoning_items() -> None:
    from stevora.llm.openai_provider import OpenAIProvider

    provider = OpenAIProvider("test", "http://127.0.0.1:9/v1")
    try:
        turn = Message.assistant(None, [CALL], [OPENAI_ITEM])
        request = LlmRequest(
            model="o4-mini",
            messages=[Message.user("q"), turn, Message.tool_result("call_1", "x")],
            reasoning_effort="low",
        )
        kwargs = provider.build_kwargs(request)
        assert kwargs["reasoning_effort"] == "low"
        assert "reasoning" not in json.dumps(kwargs["messages"])
    finally:
        await provider.aclose()


@pytest.mark.parametrize(
    ("schema", "strict"),
    [
        (
            {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
                "additionalProperties": False,
            },
            True,
        ),
        ({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, False),
        (
            {
                "type": "object",
                "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["q"],
                "additionalProperties": False,
            },
            False,
        ),
        (
            {
                "type": "object",
                "properties": {
                    "inner": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
                },
                "required": ["inner"],
                "additionalProperties": False,
            },
            False,
        ),
        (
            {
                "type": "object",
                "properties": {
                    "list": {
                        "type": "array",
                        "items": {"type": "object", "properties": {}, "additionalProperties": False},
                    }
                },
                "required": ["list"],
                "additionalProperties": False,
            },
            True,
        ),
        (
            {
                "type": "object",
                "properties": {"properties": {"type": "string"}},
                "required": ["properties"],
                "additionalProperties": False,
            },
            True,
        ),
        ({"oneOf": [{"type": "string"}]}, False),
    ],
)
def test_strict_is_sent_only_for_schemas_strict_mode_takes_as_they_are(
    schema: dict[str, Any], strict: bool
) -> None:
    assert openai_responses.tool_param(ToolSpec("t", "T", schema))["strict"] is strict


def _step(**fields: Any) -> dict[str, Any]:
    return {
        "type": "llm",
        "name": "a",
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "x"}],
        **fields,
    }


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"maxTokens": 2000, "thinking": {"budgetTokens": 2000}}, "less than maxTokens"),
        ({"thinking": {"budgetTokens": 512}}, "greater than or equal to 1024"),
        ({"temperature": 0.3, "thinking": {"budgetTokens": 1024}}, "temperature"),
        (
            {
                "tools": ["lookup"],
                "toolChoice": "required",
                "thinking": {"budgetTokens": 1024},
            },
            "forced toolChoice",
        ),
        ({"api": "assistants"}, "'chat' or 'responses'"),
        ({"reasoning": {"effort": "huge"}}, "effort"),
    ],
)
def test_definition_refuses_what_the_apis_refuse_naming_the_field(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        LlmStep.model_validate(_step(**fields))
    error = caught.value.errors()[0]
    assert words in str(error["msg"]) or words in str(error["loc"])
    assert error["loc"][0] in ("thinking", "api", "reasoning")


def test_the_run_page_reads_thinking_text_and_summaries_never_redacted_data() -> None:
    stored = [r.to_dict() for r in (THINKING, REDACTED, OPENAI_ITEM)]
    assert thinking_texts(stored) == ["let me think \u00e9 \ud800", "plan"]
    assert thinking_texts(None) == [] and thinking_texts([{"kind": "x"}]) == []
