"""Reasoning kept across tool rounds, through the real SDKs against the loopback fake: Anthropic
thinking blocks (signed) and OpenAI Responses reasoning items (encrypted), streamed and not."""

from __future__ import annotations

import json
from collections.abc import Callable

import openai
import pytest

from stevora.errors import ProviderError
from stevora.llm import openai_responses
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.messages import LlmRequest, Message, ReasoningItem, ToolSpec
from stevora.llm.openai_provider import OpenAIProvider
from stevora.testing.fake_llm import FakeLLMServer, anthropic_text, anthropic_tool_use, as_is_server
from stevora.testing.fake_responses import responses_text, responses_tool_calls
from stevora.testing.fake_stream import streamed

LOOKUP = ToolSpec(
    "lookup",
    "Look a thing up",
    {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
        "additionalProperties": False,
    },
)


class _Sink:
    def __init__(self) -> None:
        self.first = False
        self.pieces: list[str] = []

    def first_token(self) -> None:
        self.first = True

    def text(self, piece: str) -> None:
        self.pieces.append(piece)


LOOSE = ToolSpec("loose", "Optional argument", {"type": "object", "properties": {"q": {"type": "string"}}})


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_thinking_blocks_go_back_unchanged_before_the_tool_use(
    fake_llm: FakeLLMServer, make_anthropic: Callable[..., AnthropicProvider], stream: bool
) -> None:
    provider = make_anthropic()
    provider.stream = stream
    fake_llm.anthropic.enqueue(
        anthropic_tool_use(
            [("toolu_1", "lookup", {"q": "a"})], thinking="I should look up a", redacted_thinking=True
        ),
        anthropic_text("it is a", thinking="now I know"),
    )
    request = LlmRequest(
        model="claude-sonnet-4-5",
        messages=[Message.user("what is a?")],
        tools=[LOOKUP],
        max_tokens=4000,
        thinking_budget_tokens=2048,
    )
    first = await provider.complete(request)
    assert [r.item()["type"] for r in first.reasoning] == ["thinking", "redacted_thinking"]
    assert first.reasoning[0].item()["thinking"] == "I should look up a"
    assert first.usage.reasoning_tokens == len("I should look up a") // 4
    assert fake_llm.anthropic.requests[0].json["thinking"] == {"type": "enabled", "budget_tokens": 2048}

    request.messages += [first.to_message(), Message.tool_result("toolu_1", "a is a letter")]
    second = await provider.complete(request)
    assert second.text == "it is a" and second.reasoning[0].item()["thinking"] == "now I know"
    sent = fake_llm.anthropic.requests[1].json["messages"][1]["content"]
    assert [b["type"] for b in sent] == ["thinking", "redacted_thinking", "tool_use"]
    first_content = [r.item() for r in first.reasoning]
    assert sent[:2] == first_content  # byte-for-byte the blocks of the answer, signatures included


async def test_anthropic_refuses_a_tool_turn_without_its_thinking_or_with_a_changed_signature(
    fake_llm: FakeLLMServer, make_anthropic: Callable[..., AnthropicProvider]
) -> None:
    provider = make_anthropic()
    provider.stream = False
    fake_llm.anthropic.enqueue(anthropic_tool_use([("toolu_1", "lookup", {"q": "a"})], thinking="plan"))
    request = LlmRequest(
        model="claude-sonnet-4-5", messages=[Message.user("q")], tools=[LOOKUP], thinking_budget_tokens=1024
    )
    first = await provider.complete(request)
    dropped = Message.assistant(None, first.tool_calls)
    with pytest.raises(ProviderError, match="Expected `thinking` or `redacted_thinking`") as caught:
        await provider.complete(
            LlmRequest(
                model="claude-sonnet-4-5",
                messages=[Message.user("q"), dropped, Message.tool_result("toolu_1", "x")],
                tools=[LOOKUP],
                thinking_budget_tokens=1024,
            )
        )
    assert caught.value.status_code == 400
    item = first.reasoning[0].item()
    forged = ReasoningItem.of("anthropic", {**item, "thinking": item["thinking"] + "!"})
    changed = Message.assistant(None, first.tool_calls, [forged])
    with pytest.raises(ProviderError, match="Invalid `signature`"):
        await provider.complete(
            LlmRequest(
                model="claude-sonnet-4-5",
                messages=[Message.user("q"), changed, Message.tool_result("toolu_1", "x")],
                tools=[LOOKUP],
                thinking_budget_tokens=1024,
            )
        )


def _responses_request(**extra: object) -> LlmRequest:
    """A reasoning model's tool round on the Responses API, with every option the adapter maps."""
    return LlmRequest(
        model="o4-mini",
        messages=[Message.system("be brief"), Message.user("what is a?")],
        tools=[LOOKUP, LOOSE],
        api="responses",
        reasoning_effort="low",
        max_tokens=500,
        cache_key="wfrun_1",
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_api_reasoning_items_go_back_before_their_function_calls(
    fake_llm: FakeLLMServer, make_openai: Callable[..., OpenAIProvider], stream: bool
) -> None:
    provider = make_openai()
    provider.stream = stream
    fake_llm.responses.enqueue(
        responses_tool_calls(
            [("call_1", "lookup", '{"q":"a"}'), ("call_2", "loose", "{}")], reasoning="two lookups"
        ),
        responses_text("a is a letter", reasoning="summarise"),
    )
    request = _responses_request()
    first = await provider.complete(request)
    assert [c.id for c in first.tool_calls] == ["call_1", "call_2"] and first.finish_reason == "tool_calls"
    assert first.usage.reasoning_tokens == 7 and first.usage.output_tokens == 12
    body = fake_llm.responses.requests[0].json
    assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    assert body["reasoning"] == {"effort": "low"} and body["max_output_tokens"] == 500
    assert body["parallel_tool_calls"] is True and body["prompt_cache_key"] == "wfrun_1"
    assert [(t["name"], t["strict"]) for t in body["tools"]] == [("lookup", True), ("loose", False)]
    assert (body.get("stream") is True) == stream

    request.messages += [
        first.to_message(),
        Message.tool_result("call_1", "a is a letter"),
        Message.tool_result("call_2", "ok"),
    ]
    sink = _Sink()
    request.sink = sink
    second = await provider.complete(request)
    assert second.text == "a is a letter" and second.finish_reason == "stop"
    # Streamed: the text reached the live sink in pieces, as on Chat Completions.
    assert (sink.first, "".join(sink.pieces), len(sink.pieces) > 1) == (
        (True, "a is a letter", True) if stream else (False, "", False)
    )
    items = fake_llm.responses.requests[1].json["input"]
    assert [i.get("type", i.get("role")) for i in items] == [
        "system",
        "user",
        "reasoning",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert items[2] == first.reasoning[0].item() and items[2]["encrypted_content"]
    # The items that followed the reasoning item go back as the API wrote them: with their ids.
    ids = first.reasoning[-1]
    assert ids.kind == "openai_item_ids"
    assert [i["id"] for i in items[3:5]] == [ids.item()["calls"]["call_1"], ids.item()["calls"]["call_2"]]
    assert all(i["id"].startswith("fc_") for i in items[3:5])
    # A final answer's message keeps its id too (a guardrail's feedback round would send it back).
    assert second.reasoning[-1].item()["message"].startswith("msg_")


async def test_responses_api_refuses_function_call_output_without_its_reasoning_item(
    fake_llm: FakeLLMServer, make_openai: Callable[..., OpenAIProvider]
) -> None:
    provider = make_openai()
    fake_llm.responses.enqueue(responses_tool_calls([("call_1", "lookup", '{"q":"a"}')], reasoning="plan"))
    request = LlmRequest(model="o4-mini", messages=[Message.user("q")], tools=[LOOKUP], api="responses")
    first = await provider.complete(request)
    bare = Message.assistant(None, first.tool_calls)
    with pytest.raises(ProviderError, match="without its required 'reasoning' item") as caught:
        await provider.complete(
            LlmRequest(
                model="o4-mini",
                messages=[Message.user("q"), bare, Message.tool_result("call_1", "x")],
                tools=[LOOKUP],
                api="responses",
            )
        )
    assert caught.value.status_code == 400 and not caught.value.retryable
    item = first.reasoning[0].item()
    tampered = ReasoningItem.of(
        "openai_responses", {**item, "encrypted_content": "x" + item["encrypted_content"]}
    )
    with pytest.raises(ProviderError, match="could not be verified"):
        await provider.complete(
            LlmRequest(
                model="o4-mini",
                messages=[
                    Message.user("q"),
                    Message.assistant(None, first.tool_calls, [tampered, *first.reasoning[1:]]),
                    Message.tool_result("call_1", "x"),
                ],
                tools=[LOOKUP],
                api="responses",
            )
        )


async def test_reasoning_of_one_provider_is_not_sent_to_another(
    fake_llm: FakeLLMServer, make_openai: Callable[..., OpenAIProvider]
) -> None:
    """A fallback from Anthropic to OpenAI: the thinking blocks stay out of the Responses input."""
    provider = make_openai()
    provider.stream = False
    fake_llm.responses.enqueue(responses_text("fine", model="gpt-4o-mini"))
    thinking = ReasoningItem.of("anthropic", {"type": "thinking", "thinking": "t", "signature": "s"})
    from stevora.llm.messages import ToolCall

    turn = Message.assistant(None, [ToolCall("toolu_1", "lookup", '{"q":"a"}')], [thinking])
    await provider.complete(
        LlmRequest(
            model="gpt-4o-mini",
            messages=[Message.user("q"), turn, Message.tool_result("toolu_1", "x")],
            tools=[LOOKUP],
            api="responses",
        )
    )
    items = fake_llm.responses.requests[0].json["input"]
    assert "reasoning" not in json.dumps([i.get("type") for i in items])


async def test_the_fake_thinks_whenever_thinking_is_on_as_the_api_does(
    fake_llm: FakeLLMServer, make_anthropic: Callable[..., AnthropicProvider]
) -> None:
    """A script written without thinking still answers with a signed thinking block when the
    request enables thinking, so any thinking agent's round trip is checked."""
    provider = make_anthropic()
    fake_llm.anthropic.enqueue(
        anthropic_tool_use([("toolu_1", "lookup", {"q": "a"})]), anthropic_text("plain")
    )
    thinking = LlmRequest(
        model="claude-sonnet-4-5", messages=[Message.user("q")], tools=[LOOKUP], thinking_budget_tokens=1024
    )
    answer = await provider.complete(thinking)
    assert [r.item()["type"] for r in answer.reasoning] == ["thinking"] and answer.usage.reasoning_tokens > 0
    plain = await provider.complete(LlmRequest(model="claude-sonnet-4-5", messages=[Message.user("q")]))
    assert plain.reasoning == [] and plain.text == "plain"


async def test_without_the_encrypted_content_include_a_stateless_reasoning_item_cannot_go_back(
    fake_llm: FakeLLMServer, make_openai: Callable[..., OpenAIProvider]
) -> None:
    """What Stevora's `include` avoids: with `store: false` and no `reasoning.encrypted_content`,
    the reasoning item comes back bare, and sending it back is refused."""
    provider = make_openai()
    fake_llm.responses.enqueue(responses_tool_calls([("call_1", "lookup", '{"q":"a"}')]))
    bare = await provider.client.responses.create(model="o4-mini", input="q", store=False)
    item = bare.output[0]
    assert item.type == "reasoning" and item.encrypted_content is None
    with pytest.raises(openai.BadRequestError, match="not persisted"):
        await provider.client.responses.create(
            model="o4-mini",
            store=False,
            input=[
                {"role": "user", "content": "q"},
                item.model_dump(exclude_none=True),
                {
                    "type": "function_call",
                    "id": bare.output[1].id,
                    "call_id": "call_1",
                    "name": "lookup",
                    "arguments": '{"q":"a"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "x"},
            ],
        )


@pytest.mark.parametrize("fault", ["error_after", "drop_after"])
async def test_a_responses_stream_that_breaks_after_it_began_is_a_retryable_error(
    fake_llm: FakeLLMServer, make_openai: Callable[..., OpenAIProvider], fault: str
) -> None:
    provider = make_openai()
    fake_llm.responses.enqueue(streamed(responses_text("a long answer in pieces"), chunks=4, **{fault: 2}))
    with pytest.raises(ProviderError, match="stream broke after the answer began") as caught:
        await provider.complete(LlmRequest(model="o4-mini", messages=[Message.user("q")], api="responses"))
    assert caught.value.retryable


@pytest.mark.parametrize("stream", [False, True])
async def test_the_responses_body_sent_is_the_one_the_sdks_typed_create_sends(
    fake_llm: FakeLLMServer, make_openai: Callable[..., OpenAIProvider], stream: bool
) -> None:
    """As on Chat Completions, the Responses body goes as `extra_body` (no per-call typed transform
    of the input items): the JSON the server receives is `responses.create(**build_kwargs(...))`'s."""
    provider = make_openai()
    provider.stream = stream
    request = _responses_request(timeout_s=9.0)
    fake_llm.responses.enqueue(responses_text("a"), responses_text("a"))
    await provider.complete(request)
    kwargs = openai_responses.build_kwargs(request, provider.structured_plan(request))
    if stream:
        kwargs["stream"] = True
    answer = await provider.client.responses.create(**kwargs)
    if stream:
        async for _ in answer:
            pass
    ours, typed = (r.json for r in fake_llm.responses.requests)
    assert ours == typed and len(ours["input"]) == 2 and len(ours["tools"]) == 2


@pytest.mark.parametrize(
    "events",
    [
        [b'"just a string"'],
        [b"{not json"],
        [b'{"type":"response.output_text.delta"}'],
        [b'{"type":"response.output_item.added","output_index":0,"item":"f"}'],
        [b'{"type":"response.completed","response":"done"}'],
        [b'{"type":"response.completed","response":{"output":[{"type":"message","content":7}]}}'],
        [b'{"type":"response.failed","response":{"error":{"message":"the model broke"}}}'],
        [b'{"error":{"message":"overloaded","type":"server_error"}}'],
        [b'{"type":"response.output_text.delta","delta":"hi"}'],
        [
            b'{"type":"response.completed","response":{"id":"r","model":"m","status":"completed",'
            b'"output":[{"type":"function_call","call_id":"c","name":"f","arguments":7}]}}'
        ],
        [b'{"type":"response.completed","response":{"id":"r","model":["m"],"output":[]}}'],
    ],
    ids=[
        "not-an-object",
        "not-json",
        "delta-without-delta",
        "item-not-an-object",
        "final-response-not-an-object",
        "final-content-not-parts",
        "failed",
        "error-chunk",
        "ended-before-the-final-event",
        "arguments-not-a-string",
        "model-not-a-string",
    ],
)
async def test_a_hostile_responses_event_is_a_retryable_broken_stream(events: list[bytes]) -> None:
    """The Responses events are read as JSON by the adapter (not through the SDK's event models):
    whatever a server sends there ends as a retryable `ProviderError`, never as another exception."""
    body = b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    with as_is_server(body) as url:
        provider = OpenAIProvider("test", f"{url}/v1", max_retries=0)
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(
                    LlmRequest(model="o4-mini", messages=[Message.user("q")], api="responses")
                )
        finally:
            await provider.aclose()
    assert caught.value.retryable and "stream broke" in caught.value.message
    if b"the model broke" in body or b"overloaded" in body:
        assert "the model broke" in caught.value.message or "overloaded" in caught.value.message


@pytest.mark.parametrize(
    "body",
    [
        b'"just a string"',
        b'{"id":"r","model":"m","status":"completed","output":"not items"}',
        b'{"id":"r","model":"m","status":"completed","output":[{"type":"function_call","call_id":"c",'
        b'"name":"f","arguments":{"a":1}}]}',
        b'{"id":"r","model":7,"status":"completed","output":[]}',
        b'{"id":"r","model":"m","status":"completed","output":[],"usage":{"input_tokens":"many"}}',
    ],
    ids=["not-an-object", "output-not-items", "arguments-not-a-string", "model-not-a-string", "bad-usage"],
)
async def test_a_hostile_plain_responses_answer_is_a_retryable_provider_error(body: bytes) -> None:
    """The SDK builds a plain Responses answer without validating it (any JSON object gets to the
    adapter): whatever it holds ends as a retryable `ProviderError`, never as another exception
    or an `LlmResponse` with a number where text belongs."""
    with as_is_server(body, "application/json") as url:
        provider = OpenAIProvider("test", f"{url}/v1", max_retries=0, stream=False)
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(
                    LlmRequest(model="o4-mini", messages=[Message.user("q")], api="responses")
                )
        finally:
            await provider.aclose()
    assert caught.value.retryable and "not a Responses API response" in caught.value.message
