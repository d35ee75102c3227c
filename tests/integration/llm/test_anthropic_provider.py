"""AnthropicProvider against the real `anthropic` SDK and the loopback fake."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import pytest

from stevora.errors import ProviderError
from stevora.llm.anthropic_provider import AnthropicProvider, thinking_item
from stevora.llm.messages import LlmRequest, Message, ToolCall, ToolSpec
from stevora.llm.provider import JSON_INSTRUCTION
from stevora.llm.transcript import prepare_transcript
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    as_is_server,
    error,
    scripted_responder,
)
from stevora.testing.fake_reasoning import sign

AnthropicFactory = Callable[..., AnthropicProvider]

WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = ToolSpec("get_time", "Current time", {"type": "object", "properties": {}})


def _request(*messages: Message, **kwargs: object) -> LlmRequest:
    return LlmRequest(model="claude-haiku-4-5", messages=list(messages), **kwargs)  # type: ignore[arg-type]


async def test_text_answer_with_cache_tokens_counted_into_input(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    fake_llm.anthropic.enqueue(
        anthropic_text(
            "Bonjour.",
            model="claude-haiku-4-5-20251001",
            usage={
                "input_tokens": 20,
                "output_tokens": 7,
                "cache_read_input_tokens": 300,
                "cache_creation_input_tokens": 50,
            },
        )
    )
    response = await make_anthropic().complete(_request(Message.system("Be terse."), Message.user("Hi")))

    assert response.text == "Bonjour."
    assert response.finish_reason == "stop"
    assert response.model == "claude-haiku-4-5-20251001"
    assert response.provider == "anthropic"
    assert response.usage.to_dict() == {
        "input_tokens": 370,
        "output_tokens": 7,
        "cache_read_tokens": 300,
        "cache_write_tokens": 50,
        "reasoning_tokens": 0,
    }
    sent = fake_llm.anthropic.requests[0].json
    assert sent["system"] == "Be terse."
    assert sent["max_tokens"] == 4096
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]


async def test_tool_use_round_trip_merges_results_into_one_user_turn_before_text(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    fake_llm.anthropic.enqueue(
        anthropic_tool_use(
            [("toolu_01", "get_weather", {"city": "Paris"}), ("toolu_02", "get_time", {})], text="Checking."
        ),
        anthropic_text("Sunny, noon."),
    )
    provider = make_anthropic()
    conversation = [Message.system("You are terse."), Message.user("Weather and time?")]
    first = await provider.complete(_request(*conversation, tools=[WEATHER, TIME]))

    assert first.text == "Checking."
    assert first.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("toolu_01", "get_weather", '{"city":"Paris"}'),
        ("toolu_02", "get_time", "{}"),
    ]
    conversation += [
        first.to_message(),
        Message.tool_result("toolu_01", '{"temp_c": 21}'),
        Message.tool_result("toolu_02", '{"error": "clock broken"}', is_error=True),
        Message.user("Be brief."),
    ]
    second = await provider.complete(_request(*conversation, tools=[WEATHER, TIME]))
    assert second.text == "Sunny, noon."

    round_one, round_two = (r.json for r in fake_llm.anthropic.requests)
    assert round_one["tools"][0] == {
        "name": "get_weather",
        "description": WEATHER.description,
        "input_schema": WEATHER.parameters,
    }
    assert round_two["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}},
        ],
    }
    assert round_two["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": '{"temp_c": 21}'},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_02",
                "content": '{"error": "clock broken"}',
                "is_error": True,
            },
            {"type": "text", "text": "Be brief."},
        ],
    }
    assert len(round_two["messages"]) == 3


async def test_options_temperature_travels_in_the_body_and_parallel_use_can_be_disabled(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    fake_llm.anthropic.enqueue(anthropic_text('{"ok": true}'))
    await make_anthropic().complete(
        _request(
            Message.system("A."),
            Message.system("B."),
            Message.user("go"),
            tools=[WEATHER],
            parallel_tool_calls=False,
            temperature=0.2,
            max_tokens=64,
            response_format="json",
        )
    )
    sent = fake_llm.anthropic.requests[0].json
    assert sent["temperature"] == 0.2
    assert sent["max_tokens"] == 64
    assert sent["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert sent["system"] == f"A.\n\nB.\n\n{JSON_INSTRUCTION}"


async def test_malformed_arguments_are_replayed_as_raw_input(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    fake_llm.anthropic.enqueue(anthropic_text("ok"))
    conversation = [
        Message.user("Weather?"),
        Message.assistant(None, [ToolCall("toolu_1", "get_weather", '{"city": "Par')]),
        Message.tool_result("toolu_1", '{"error": "bad arguments"}', is_error=True),
    ]
    await make_anthropic().complete(_request(*conversation, tools=[WEATHER]))
    tool_use = fake_llm.anthropic.requests[0].json["messages"][1]["content"][0]
    assert tool_use["input"] == {"raw": '{"city": "Par'}


async def test_openai_history_with_odd_ids_is_accepted_after_transcript_preparation(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    # A fallback from another provider: an id Anthropic rejects, and a call that never got a result.
    fake_llm.anthropic.enqueue(anthropic_text("continuing"))
    conversation = [
        Message.user("Weather?"),
        Message.assistant(None, [ToolCall("call.1/weird", "get_weather", '{"city":"Oslo"}')]),
        Message.tool_result("call.1/weird", '{"temp_c": -3}'),
        Message.assistant(None, [ToolCall("call_2", "get_time", "{}")]),
    ]
    prepared = prepare_transcript(conversation, provider_name="anthropic")
    response = await make_anthropic().complete(_request(*prepared, tools=[WEATHER, TIME]))

    assert response.text == "continuing"
    messages = fake_llm.anthropic.requests[0].json["messages"]
    assert messages[1]["content"][0]["id"] == "call_1_0"
    assert messages[2]["content"][0]["tool_use_id"] == "call_1_0"
    assert messages[4]["content"][0]["is_error"] is True


async def test_fake_rejects_tool_use_without_results_like_the_real_api(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    conversation = [
        Message.user("Weather?"),
        Message.assistant(None, [ToolCall("toolu_1", "get_weather", "{}")]),
        Message.user("hello?"),
    ]
    with pytest.raises(ProviderError) as caught:
        await make_anthropic().complete(_request(*conversation, tools=[WEATHER]))
    assert caught.value.status_code == 400
    assert caught.value.retryable is False
    assert "toolu_1" in caught.value.message


async def test_overloaded_529_exhausting_retries_is_retryable(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    fake_llm.anthropic.enqueue(
        error(529, "Overloaded", retry_after_ms=1), error(529, "Overloaded", retry_after_ms=1)
    )
    with pytest.raises(ProviderError) as caught:
        await make_anthropic(max_retries=1).complete(_request(Message.user("hi")))
    assert caught.value.retryable is True
    assert caught.value.status_code == 529
    assert len(fake_llm.anthropic.requests) == 2
    cause = caught.value.__cause__
    assert type(cause).__name__ == "OverloadedError"


async def test_rate_limit_is_retried_then_succeeds(fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory):
    fake_llm.anthropic.enqueue(error(429, "rate limited", retry_after_ms=1), anthropic_text("fine"))
    response = await make_anthropic(max_retries=2).complete(_request(Message.user("hi")))
    assert response.text == "fine"
    assert len(fake_llm.anthropic.requests) == 2


@pytest.mark.parametrize("status", [400, 401])
async def test_client_errors_are_not_retryable(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory, status: int
):
    fake_llm.anthropic.enqueue(error(status, "bad"))
    with pytest.raises(ProviderError) as caught:
        await make_anthropic(max_retries=2).complete(_request(Message.user("hi")))
    assert caught.value.retryable is False
    assert caught.value.status_code == status
    assert len(fake_llm.anthropic.requests) == 1


async def test_timeout_is_retryable(fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory):
    fake_llm.anthropic.enqueue(anthropic_text("late", delay_s=2.0))
    with pytest.raises(ProviderError) as caught:
        await make_anthropic(max_retries=0, timeout_s=0.2).complete(_request(Message.user("hi")))
    assert caught.value.retryable is True


async def test_scripted_responder_drives_a_full_tool_loop(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    fake_llm.anthropic.responder = scripted_responder("anthropic")
    provider = make_anthropic()
    conversation = [Message.user("Weather in Rome?")]
    first = await provider.complete(_request(*conversation, tools=[WEATHER]))
    assert json.loads(first.tool_calls[0].arguments) == {"city": "Rome"}  # a city, not the question
    conversation += [first.to_message(), Message.tool_result(first.tool_calls[0].id, "sunny")]
    final = await provider.complete(_request(*conversation, tools=[WEATHER]))
    assert final.text == "Scripted answer to: Weather in Rome?. Tool results: get_weather: sunny"


async def test_default_client_has_sdk_tracing_switched_off(fake_llm: FakeLLMServer):
    provider = AnthropicProvider("test", fake_llm.anthropic_base_url, max_retries=0)
    try:
        assert provider.client.open_telemetry["traces"]["enabled"] is False
        assert provider.client.max_retries == 0
    finally:
        await provider.aclose()


@pytest.mark.filterwarnings("ignore:The model 'claude-sonnet-4-20250514' is deprecated:DeprecationWarning")
async def test_retired_model_names_still_work(fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory):
    # anthropic 2.12 warns (DeprecationWarning, attributed to *our caller*) for retired models such
    # as claude-sonnet-4-20250514; the call itself goes through.
    fake_llm.anthropic.enqueue(anthropic_text("still here", model="claude-sonnet-4-20250514"))
    response = await make_anthropic().complete(
        LlmRequest(model="claude-sonnet-4-20250514", messages=[Message.user("hi")])
    )
    assert response.text == "still here"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("thinking", [False, True])
async def test_the_body_sent_is_the_one_the_sdks_typed_create_sends_byte_for_byte(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory, stream: bool, thinking: bool
):
    """The adapter sends its body through the SDK's `post` as JSON it encodes itself (no per-call
    copy of the transcript): the bytes the server receives are those `messages.create(**kwargs)`
    sends, key order included."""
    provider = make_anthropic()
    provider.stream = stream
    request = _request(
        Message.system("Be terse. Ünïcode stays as it is."),
        Message.user("weather in Paris, as json"),
        Message(
            role="assistant",
            content="Looking.",
            tool_calls=(ToolCall("toolu_A", "get_weather", '{"city": "Paris"}'),),
            reasoning=(thinking_item("Paris, then.", sign("Paris, then.")),),
        ),
        Message.tool_result("toolu_A", '{"temp": 21}'),
        tools=[WEATHER, TIME],
        temperature=0.3,
        max_tokens=None if thinking else 50,
        response_format="json",
        cache_key="run_1",
        timeout_s=9.0,
        thinking_budget_tokens=1024 if thinking else None,
    )
    fake_llm.anthropic.enqueue(anthropic_text('{"ok": true}'), anthropic_text('{"ok": true}'))
    await provider.complete(request)
    kwargs = provider.build_kwargs(request)
    if stream:
        kwargs["stream"] = True
    answer = await provider.client.messages.create(**kwargs)
    if stream:
        async for _ in answer:
            pass
    ours, typed = fake_llm.anthropic.requests
    assert ours.raw == typed.raw
    assert ours.json["messages"][1]["content"][2]["id"] == "toolu_A" and len(ours.json["tools"]) == 2
    assert ("temperature" in ours.json) is not thinking and ours.json.get("stream", False) is stream
    assert {
        k: v for k, v in ours.headers.items() if k.lower() not in ("x-stainless-retry-count",)
    }.keys() >= {k for k in typed.headers if k.lower().startswith("anthropic-")}


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b"{not json",
        b'{"content": "not a list"}',
        b'{"content": [{"type": "text"}]}',
        b'{"content": [], "model": "m", "id": "i"}',
        b'{"content": [], "model": "m", "id": "i", "usage": {"input_tokens": "many", "output_tokens": 1}}',
        b'{"content": [], "model": "m", "id": "i", "stop_reason": 5, "usage": {"input_tokens": 1, "output_tokens": 1}}',
        b'{"content": [], "model": "m", "id": "i", "stop_reason": ["end_turn"], '
        b'"usage": {"input_tokens": 1, "output_tokens": 1}}',
    ],
    ids=[
        "not-an-object",
        "not-json",
        "content-not-blocks",
        "text-block-without-text",
        "without-usage",
        "bad-usage",
        "stop-reason-a-number",
        "stop-reason-a-list",
    ],
)
async def test_an_answer_that_is_not_a_message_is_a_retryable_provider_error(body: bytes) -> None:
    """Plain answers are read as JSON by the adapter (not by the SDK's models): a 200 whose body is
    not a Messages API message ends as a retryable `ProviderError`, never as another exception."""
    with as_is_server(body, "application/json") as url:
        provider = AnthropicProvider("test", url, max_retries=0, stream=False)
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(_request(Message.user("Hi")))
        finally:
            await provider.aclose()
    assert caught.value.retryable and "not a Messages API message" in caught.value.message


async def test_each_message_is_made_once_and_sent_as_a_fresh_one_would_be_round_after_round(
    fake_llm: FakeLLMServer, make_anthropic: AnthropicFactory
):
    """An earlier turn's blocks are made once and kept on its message (`Message.wire_form`), not
    rebuilt (and its tool calls' arguments parsed again) every round: with the prompt-cache markers
    moving from round to round and parallel results merged into one turn, every body is the one
    the same transcript of new message objects gives, byte for byte; a changed message (a new
    object) is made again."""
    provider = make_anthropic()
    transcript = [Message.system("Be terse."), Message.user("Weather in three cities?")]
    options = {"tools": [WEATHER], "cache_key": "run_1", "max_tokens": 50}
    for i in range(3):
        calls = (
            ToolCall(f"toolu_{i}a", "get_weather", '{"city": "Paris"}'),
            ToolCall(f"toolu_{i}b", "get_weather", "{}"),
        )
        transcript += [
            Message(role="assistant", content=f"Round {i}.", tool_calls=calls),
            Message.tool_result(f"toolu_{i}a", f'{{"temp": {i}}}'),
            Message.tool_result(f"toolu_{i}b", "{}", is_error=True),
        ]
        fake_llm.anthropic.enqueue(anthropic_text("ok"), anthropic_text("ok"))
        await provider.complete(_request(*transcript, **options))
        await provider.complete(_request(*(Message.from_dict(m.to_dict()) for m in transcript), **options))
        kept, fresh = fake_llm.anthropic.requests[-2:]
        assert kept.raw == fresh.raw
        marked = [
            (t, b)
            for t, turn in enumerate(kept.json["messages"])
            for b, block in enumerate(turn["content"])
            if "cache_control" in block
        ]
        last = len(kept.json["messages"]) - 1
        assert marked == [(last - 2, 1 if i else 0), (last, 1)]  # the previous round's end, this one's
    assert transcript[3].wire_form("anthropic", lambda m: None) is not None  # kept on the message

    transcript[3] = dataclasses.replace(transcript[3], content='{"temp": "changed"}')
    fake_llm.anthropic.enqueue(anthropic_text("ok"))
    await provider.complete(_request(*transcript, **options))
    assert (
        fake_llm.anthropic.requests[-1].json["messages"][2]["content"][0]["content"] == '{"temp": "changed"}'
    )
