"""OpenAIProvider against the real `openai` SDK and the loopback fake."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from openai._utils._json import openapi_dumps

from stevora.errors import ProviderError
from stevora.llm import wire_json
from stevora.llm.messages import LlmRequest, Message, ToolCall, ToolSpec
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.transcript import prepare_transcript
from stevora.testing.fake_llm import (
    FakeLLMServer,
    as_is_server,
    disconnect,
    error,
    openai_text,
    openai_tool_calls,
    scripted_responder,
)

OpenAIFactory = Callable[..., OpenAIProvider]

WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = ToolSpec("get_time", "Current time", {"type": "object", "properties": {}})


def _weather_calls(*ids: str) -> list[ToolCall]:
    return [ToolCall(id=i, name="get_weather", arguments='{"city":"Paris"}') for i in ids]


def _request(*messages: Message, **kwargs: object) -> LlmRequest:
    return LlmRequest(model="gpt-4o-mini", messages=list(messages), **kwargs)  # type: ignore[arg-type]


async def test_text_answer_is_returned_with_usage_and_model(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(
        openai_text(
            "Hello!",
            model="gpt-4o-mini-2024-07-18",
            usage={
                "prompt_tokens": 120,
                "completion_tokens": 30,
                "prompt_tokens_details": {"cached_tokens": 100},
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        )
    )
    response = await make_openai().complete(_request(Message.system("Be terse."), Message.user("Hi")))

    assert response.text == "Hello!"
    assert response.tool_calls == []
    assert response.finish_reason == "stop"
    assert response.model == "gpt-4o-mini-2024-07-18"
    assert response.provider == "openai"
    assert response.response_id and response.response_id.startswith("chatcmpl-")
    assert response.usage.to_dict() == {
        "input_tokens": 120,
        "output_tokens": 30,
        "cache_read_tokens": 100,
        "cache_write_tokens": 0,
        "reasoning_tokens": 12,
    }
    sent = fake_llm.openai.requests[0].json
    assert sent["messages"] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert "tools" not in sent and "parallel_tool_calls" not in sent


async def test_parallel_tool_calls_round_trip_carries_results_with_matching_ids(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(
        openai_tool_calls([("call_A", "get_weather", '{"city":"Paris"}'), ("call_B", "get_time", "{}")]),
        openai_text("It is sunny in Paris at noon."),
    )
    provider = make_openai()
    conversation = [Message.user("Weather and time?")]
    first = await provider.complete(_request(*conversation, tools=[WEATHER, TIME], parallel_tool_calls=True))

    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("call_A", "get_weather", '{"city":"Paris"}'),
        ("call_B", "get_time", "{}"),
    ]
    assert first.finish_reason == "tool_calls"
    conversation += [
        first.to_message(),
        Message.tool_result("call_A", '{"temp_c": 21}'),
        Message.tool_result("call_B", '"12:00"'),
    ]
    second = await provider.complete(_request(*conversation, tools=[WEATHER, TIME]))
    assert second.text == "It is sunny in Paris at noon."

    round_one, round_two = (r.json for r in fake_llm.openai.requests)
    assert round_one["parallel_tool_calls"] is True
    assert round_one["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": WEATHER.description,
            "parameters": WEATHER.parameters,
        },
    }
    assert round_two["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_A",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            },
            {"id": "call_B", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    }
    assert round_two["messages"][2:] == [
        {"role": "tool", "tool_call_id": "call_A", "content": '{"temp_c": 21}'},
        {"role": "tool", "tool_call_id": "call_B", "content": '"12:00"'},
    ]


async def test_request_options_are_sent_the_way_the_sdk_expects(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(openai_text('{"ok": true}'))
    await make_openai().complete(
        _request(
            Message.user("json please"),
            tools=[WEATHER],
            parallel_tool_calls=False,
            temperature=0.3,
            max_tokens=50,
            response_format="json",
        )
    )
    sent = fake_llm.openai.requests[0].json
    assert sent["parallel_tool_calls"] is False
    assert sent["temperature"] == 0.3
    assert sent["max_completion_tokens"] == 50 and "max_tokens" not in sent
    assert sent["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize("stream", [False, True])
async def test_the_body_sent_is_the_one_the_sdks_typed_create_sends(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory, stream: bool
):
    """The adapter hands its body to the SDK as `extra_body` (no per-call typed transform): the
    JSON the server receives is the one `create(**build_kwargs(...))` sends, key for key."""
    provider = make_openai()
    provider.stream = stream
    request = _request(
        Message.system("Be terse."),
        Message.user("weather in Paris, as json"),
        Message.assistant(None, _weather_calls("call_A")),
        Message.tool_result("call_A", '{"temp": 21}'),
        tools=[WEATHER, TIME],
        temperature=0.3,
        max_tokens=50,
        response_format="json",
        cache_key="run_1",
        timeout_s=9.0,
    )
    fake_llm.openai.enqueue(openai_text('{"ok": true}'), openai_text('{"ok": true}'))
    await provider.complete(request)
    kwargs = provider.build_kwargs(request)
    if provider.streams:
        kwargs.update(stream=True, stream_options={"include_usage": True})
    answer = await provider.client.chat.completions.create(**kwargs)
    if stream:
        async for _ in answer:  # type: ignore[union-attr]
            pass
    ours, typed = (r.json for r in fake_llm.openai.requests)
    assert ours == typed
    assert ours["messages"][2]["tool_calls"][0]["id"] == "call_A" and len(ours["tools"]) == 2


async def test_a_tool_loops_earlier_messages_are_encoded_once_and_the_body_is_the_sdks_json(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory, monkeypatch: pytest.MonkeyPatch
):
    """The body goes to the SDK as the bytes its `openapi_dumps` writes (UTF-8, compact, same key
    order), and a message already sent is not encoded again, round after round."""
    encoded: list[Any] = []

    class Counting(json.JSONEncoder):
        def encode(self, o: Any) -> str:
            encoded.append(o)
            return super().encode(o)

    monkeypatch.setattr(
        wire_json, "ENCODER", Counting(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    )
    provider = make_openai()
    transcript = [Message.system("Be terse."), Message.user("Wëather in Paris?")]
    messages_per_round = []
    for round_ in range(3):
        fake_llm.openai.enqueue(openai_text("ok"))
        encoded.clear()
        await provider.complete(_request(*transcript, tools=[WEATHER]))
        raw = fake_llm.openai.requests[-1].raw
        assert raw == openapi_dumps(json.loads(raw))  # the SDK's own encoding, byte for byte
        messages_per_round.append(sum(1 for o in encoded if isinstance(o, dict) and "role" in o))
        transcript += [
            Message.assistant(None, _weather_calls(f"call_{round_}")),
            Message.tool_result(f"call_{round_}", f'{{"temp": {20 + round_}}}'),
        ]
    # The first round's two messages, then the two each round adds.
    assert messages_per_round == [2, 2, 2]


async def test_json_mode_is_accepted_even_when_the_prompt_never_says_json(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(openai_text('{"summary": "short"}'))
    response = await make_openai().complete(_request(Message.user("Summarise this."), response_format="json"))
    assert response.text == '{"summary": "short"}'
    assert "JSON" in fake_llm.openai.requests[0].json["messages"][0]["content"]


async def test_compatible_server_gets_max_tokens_and_its_own_provider_name(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(openai_text("local answer", model="llama3.2"))
    response = await make_openai(name="ollama").complete(
        LlmRequest(model="llama3.2", messages=[Message.user("hi")], max_tokens=20)
    )
    assert response.provider == "ollama"
    assert fake_llm.openai.requests[0].json["max_tokens"] == 20


async def test_malformed_arguments_are_passed_through_as_the_raw_string(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(openai_tool_calls([("call_1", "get_weather", '{"city": "Par')]))
    response = await make_openai().complete(_request(Message.user("Weather?"), tools=[WEATHER]))
    assert response.tool_calls[0].arguments == '{"city": "Par'


async def test_rate_limit_with_retry_after_ms_is_retried_by_the_sdk(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(error(429, "Rate limit reached", retry_after_ms=1), openai_text("after retry"))
    started = time.monotonic()
    response = await make_openai(max_retries=2).complete(_request(Message.user("hi")))

    assert response.text == "after retry"
    assert time.monotonic() - started < 1.0  # retry-after-ms replaced the ~0.5 s backoff
    assert [r.headers["x-stainless-retry-count"] for r in fake_llm.openai.requests] == ["0", "1"]


async def test_server_errors_exhausting_retries_raise_retryable_provider_error(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(error(500, "boom", retry_after_ms=1), error(503, "overloaded", retry_after_ms=1))
    with pytest.raises(ProviderError) as caught:
        await make_openai(max_retries=1).complete(_request(Message.user("hi")))

    assert caught.value.retryable is True
    assert caught.value.status_code == 503
    assert caught.value.provider == "openai"
    assert "overloaded" in caught.value.message
    assert len(fake_llm.openai.requests) == 2


async def test_rate_limit_error_carries_the_servers_retry_after(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(error(429, "slow down", retry_after_s=7))
    with pytest.raises(ProviderError) as caught:
        await make_openai(max_retries=0).complete(_request(Message.user("hi")))
    assert caught.value.retryable is True
    assert caught.value.retry_after_s == pytest.approx(7.0)


async def test_quota_429_marked_do_not_retry_is_not_retryable(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(error(429, "You exceeded your current quota", should_retry=False))
    with pytest.raises(ProviderError) as caught:
        await make_openai(max_retries=2).complete(_request(Message.user("hi")))
    assert caught.value.retryable is False
    assert len(fake_llm.openai.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_client_errors_are_not_retryable_and_not_retried(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory, status: int
):
    fake_llm.openai.enqueue(error(status, "nope"))
    with pytest.raises(ProviderError) as caught:
        await make_openai(max_retries=2).complete(_request(Message.user("hi")))
    assert caught.value.retryable is False
    assert caught.value.status_code == status
    assert len(fake_llm.openai.requests) == 1


async def test_timeout_raises_retryable_provider_error(fake_llm: FakeLLMServer, make_openai: OpenAIFactory):
    fake_llm.openai.enqueue(openai_text("too late", delay_s=2.0))
    with pytest.raises(ProviderError) as caught:
        await make_openai(max_retries=0, timeout_s=0.2).complete(_request(Message.user("hi")))
    assert caught.value.retryable is True
    assert caught.value.status_code is None
    assert "timed out" in caught.value.message


async def test_per_request_timeout_overrides_the_client_timeout(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(openai_text("too late", delay_s=2.0))
    with pytest.raises(ProviderError, match="timed out"):
        await make_openai(max_retries=0, timeout_s=30).complete(_request(Message.user("hi"), timeout_s=0.2))


async def test_dropped_connection_is_a_retryable_connection_error(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(disconnect())
    with pytest.raises(ProviderError) as caught:
        await make_openai(max_retries=0).complete(_request(Message.user("hi")))
    assert caught.value.retryable is True
    assert "connection" in caught.value.message


async def test_unreachable_server_is_a_retryable_connection_error():
    provider = OpenAIProvider("test", "http://127.0.0.1:9/v1", max_retries=0, timeout_s=2)
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(_request(Message.user("hi")))
    finally:
        await provider.aclose()
    assert caught.value.retryable is True


async def test_fake_rejects_an_unanswered_tool_call_like_the_real_api(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    conversation = [
        Message.user("Weather?"),
        Message.assistant(None, _weather_calls("call_1")),
        Message.user("never mind"),
    ]
    with pytest.raises(ProviderError) as caught:
        await make_openai().complete(_request(*conversation, tools=[WEATHER]))
    assert caught.value.status_code == 400
    assert "call_1" in caught.value.message


async def test_prepared_transcript_with_an_interrupted_call_is_accepted(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.enqueue(openai_text("recovered"))
    conversation = [Message.user("Weather?"), Message.assistant(None, _weather_calls("call_1"))]
    prepared = prepare_transcript(conversation, provider_name="openai")
    response = await make_openai().complete(_request(*prepared, tools=[WEATHER]))
    assert response.text == "recovered"
    assert fake_llm.openai.requests[0].json["messages"][-1]["tool_call_id"] == "call_1"


async def test_a_hundred_concurrent_tool_loops_all_complete(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory
):
    fake_llm.openai.responder = scripted_responder("openai")
    provider = make_openai(max_retries=0)

    async def loop(n: int) -> str:
        conversation = [Message.user(f"question {n}")]
        first = await provider.complete(_request(*conversation, tools=[WEATHER]))
        conversation += [first.to_message(), *(Message.tool_result(c.id, "sunny") for c in first.tool_calls)]
        final = await provider.complete(_request(*conversation, tools=[WEATHER]))
        return final.text or ""

    answers = await asyncio.gather(*(loop(n) for n in range(100)))
    assert all(answer.startswith(f"Scripted answer to: question {n}.") for n, answer in enumerate(answers))
    assert len(fake_llm.openai.requests) == 200


@pytest.mark.parametrize(
    "body",
    [
        b'{"id":"c","model":"m","choices":"not a list"}',
        b'{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":7},'
        b'"finish_reason":"stop"}]}',
        b'{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,'
        b'"tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":{"a":1}}}]},'
        b'"finish_reason":"tool_calls"}]}',
        b'{"id":"c","model":["m"],"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},'
        b'"finish_reason":"stop"}]}',
    ],
    ids=["choices-not-a-list", "content-not-a-string", "arguments-not-a-string", "model-not-a-string"],
)
async def test_a_hostile_plain_chat_answer_is_a_retryable_provider_error(body: bytes) -> None:
    """The SDK builds a plain answer without validating it (its clients are not strict): whatever
    a server sends ends as a retryable `ProviderError`, never as another exception or an
    `LlmResponse` with a number where text belongs."""
    with as_is_server(body, "application/json") as url:
        provider = OpenAIProvider("test", f"{url}/v1", max_retries=0, stream=False)
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(_request(Message.user("hi")))
        finally:
            await provider.aclose()
    assert caught.value.retryable and "not a chat completion" in caught.value.message
