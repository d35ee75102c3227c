"""Streamed calls through the real SDKs against the fake's SSE streams (strict validation on):
the same answer streamed and not streamed gives the same `LlmResponse`; the sink hears the first
token and the text in pieces; a stream that breaks after the 200 is a retryable error the SDK did
not resend; `stream_options` goes only to servers whose capability says they take it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from stevora.errors import ProviderError
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.capabilities import ServerCapabilities
from stevora.llm.messages import LlmRequest, LlmResponse, Message
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.setup import build_router
from stevora.settings import Settings
from stevora.testing.fake_llm import (
    FakeLLMServer,
    FakeResponse,
    anthropic_text,
    anthropic_tool_use,
    as_is_server,
    openai_text,
    openai_tool_calls,
)
from stevora.testing.fake_stream import StreamDefaults, streamed

Make = Callable[..., OpenAIProvider | AnthropicProvider]
TEXT = "Refunds are possible within thirty days of delivery."


class Sink:
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first_tokens: list[float] = []
        self.pieces: list[str] = []

    def first_token(self) -> None:
        self.first_tokens.append(time.perf_counter() - self.started)

    def text(self, piece: str) -> None:
        self.pieces.append(piece)


def _request(sink: Sink | None = None) -> LlmRequest:
    return LlmRequest(model="m", messages=[Message.user("Can I get a refund?")], sink=sink)


ANSWERS = {
    "openai-text": lambda: openai_text(TEXT, usage={"prompt_tokens": 42, "completion_tokens": 17}),
    "openai-tools": lambda: openai_tool_calls(
        [("call_1", "search_kb", '{"query": "refunds", "limit": 3}'), ("call_2", "get_customer", "{}")],
        text="Let me look.",
        usage={"prompt_tokens": 50, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 8}},
    ),
    "anthropic-text": lambda: anthropic_text(
        TEXT, usage={"input_tokens": 30, "output_tokens": 12, "cache_read_input_tokens": 5}
    ),
    "anthropic-tools": lambda: anthropic_tool_use(
        [("toolu_1", "search_kb", {"query": "refunds", "limit": 3}), ("toolu_2", "get_customer", {})],
        text="Let me look.",
        usage={"input_tokens": 60, "output_tokens": 25, "cache_creation_input_tokens": 7},
    ),
}


def _provider(
    kind: str, make_openai: Make, make_anthropic: Make, *, stream: bool
) -> OpenAIProvider | AnthropicProvider:
    provider = make_openai() if kind.startswith("openai") else make_anthropic()
    provider.stream = stream
    return provider


@pytest.mark.parametrize("kind", sorted(ANSWERS))
async def test_a_streamed_answer_equals_the_same_answer_not_streamed(
    kind: str, fake_llm: FakeLLMServer, make_openai: Make, make_anthropic: Make
) -> None:
    answer: FakeResponse = ANSWERS[kind]()
    fake_llm.enqueue(answer, answer)  # the very same body, once each way
    plain = await _provider(kind, make_openai, make_anthropic, stream=False).complete(_request())
    sink = Sink()
    live = await _provider(kind, make_openai, make_anthropic, stream=True).complete(_request(sink))

    assert [r.json.get("stream") for r in fake_llm.requests] == [None, True]
    assert live == plain
    assert isinstance(live, LlmResponse) and live.usage.total_tokens > 0
    assert len(sink.first_tokens) == 1
    assert "".join(sink.pieces) == (plain.text or "")
    assert len(sink.pieces) > 1  # the fake cut the text, the adapter passed every piece on


@pytest.mark.parametrize("kind", ["openai-tools", "anthropic-tools"])
async def test_time_to_first_token_is_the_servers_first_token_delay(
    kind: str, fake_llm: FakeLLMServer, make_openai: Make, make_anthropic: Make
) -> None:
    fake_llm.enqueue(streamed(ANSWERS[kind](), first_token_s=0.3, chunk_delay_s=0.05))
    sink = Sink()
    response = await _provider(kind, make_openai, make_anthropic, stream=True).complete(_request(sink))

    assert response.tool_calls
    assert 0.3 <= sink.first_tokens[0] < 0.3 + 0.5
    assert time.perf_counter() - sink.started >= 0.3 + 0.05  # later chunks came after their delay


@pytest.mark.parametrize("kind", ["openai-text", "anthropic-text"])
@pytest.mark.parametrize("fault", ["error_after", "drop_after"])
async def test_a_stream_that_breaks_after_the_200_is_retryable_and_not_resent_by_the_sdk(
    kind: str, fault: str, fake_llm: FakeLLMServer, make_openai: Make, make_anthropic: Make
) -> None:
    fake_llm.enqueue(streamed(ANSWERS[kind](), **{fault: 2}))
    provider = make_openai(max_retries=2) if kind.startswith("openai") else make_anthropic(max_retries=2)
    sink = Sink()
    with pytest.raises(ProviderError) as caught:
        await provider.complete(_request(sink))

    assert caught.value.retryable
    assert "stream broke" in caught.value.message
    assert len(fake_llm.requests) == 1  # the SDKs retry only before the 200
    assert len(sink.pieces) == 2  # what arrived before the break was heard


async def test_stream_options_go_only_to_servers_that_take_them() -> None:
    with FakeLLMServer(stream=StreamDefaults(chunks=2)) as fake:
        fake.openai.enqueue(*(openai_text("hi") for _ in range(3)))
        plain_server = OpenAIProvider("k", fake.openai_base_url, name="llamacpp", max_retries=0)
        usage_streams = OpenAIProvider(
            "k", fake.openai_base_url, name="vllm", max_retries=0,
            capabilities=ServerCapabilities(stream_usage=True),
        )  # fmt: skip
        no_usage = OpenAIProvider(
            "k",
            fake.openai_base_url,
            name="bare",
            max_retries=0,
            capabilities=ServerCapabilities(usage=False),
        )
        answers = [await p.complete(_request()) for p in (plain_server, usage_streams, no_usage)]
        for provider in (plain_server, usage_streams, no_usage):
            await provider.aclose()
        sent = [r.json for r in fake.requests]

    # A server whose streams carry no usage is not streamed: its plain answers carry the cost.
    assert "stream" not in sent[0] and answers[0].usage.total_tokens == 15
    assert sent[1]["stream"] is True and sent[1]["stream_options"] == {"include_usage": True}
    assert answers[1].usage.total_tokens == 15
    assert sent[2]["stream"] is True and "stream_options" not in sent[2]
    assert [a.text for a in answers] == ["hi", "hi", "hi"]


async def test_stevora_llm_stream_false_turns_streaming_off_for_every_sdk_provider(
    settings: Settings,
) -> None:
    keys = {
        "openai_api_key": "k",
        "anthropic_api_key": "k",
        "compat_base_urls": {"local": "http://127.0.0.1:9/v1"},
    }
    on = build_router(settings.model_copy(update=keys))
    off = build_router(settings.model_copy(update={**keys, "llm_stream": False}))
    for name in ("openai", "anthropic", "local"):
        assert on.get(name).stream is True
        assert off.get(name).stream is False
    await on.aclose()
    await off.aclose()


@pytest.mark.parametrize("kind", ["openai-text", "anthropic-text"])
async def test_the_requests_timeout_bounds_the_whole_stream_not_just_the_gaps(
    kind: str, fake_llm: FakeLLMServer, make_openai: Make, make_anthropic: Make
) -> None:
    # Every gap (0.15 s) is far below the SDK's read timeout; the answer as a whole takes ~0.9 s.
    fake_llm.enqueue(streamed(ANSWERS[kind](), chunk_delay_s=0.15, chunks=6))
    provider = _provider(kind, make_openai, make_anthropic, stream=True)
    request = _request(Sink())
    request.timeout_s = 0.5
    started = time.perf_counter()
    with pytest.raises(ProviderError) as caught:
        await provider.complete(request)

    assert caught.value.retryable and "no complete answer within 0.5 s" in caught.value.message
    assert time.perf_counter() - started < 0.5 + 0.3


@pytest.mark.parametrize("kind", ["openai-tools", "anthropic-tools"])
async def test_back_to_back_streams_reuse_the_pooled_connection_without_retries(
    kind: str, fake_llm: FakeLLMServer, make_openai: Make, make_anthropic: Make
) -> None:
    # A stream that ends properly leaves the keep-alive connection usable (SDK retries are off).
    provider = _provider(kind, make_openai, make_anthropic, stream=True)
    for _ in range(10):
        fake_llm.enqueue(ANSWERS[kind]())
        assert (await provider.complete(_request())).tool_calls
    assert len(fake_llm.requests) == 10
    assert len(set(fake_llm.client_ports)) == 1  # one kept-alive connection


@pytest.mark.parametrize(
    "chunk",
    [
        b'"just a string"',
        b"{not json",
        b'{"id":"c1","model":"m","choices":[{"delta":{"tool_calls":[{"id":"x","function":{"name":"f"}}]}}]}',
        b'{"id":"c1","model":"m","choices":[{"delta":{"tool_calls":[{"index":0,"function":"f"}]}}]}',
        b'{"id":"c1","model":"m","choices":[{"delta":{"content":"hi"}}],"usage":{"prompt_tokens":"many"}}',
        # Two calls whose indexes cannot be ordered (int and str), then a proper end.
        b'{"id":"c1","model":"m","choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f"}},'
        b'{"index":"1","id":"b","function":{"name":"g"}}]},"finish_reason":"tool_calls"}]}',
        b'{"id":"c1","model":"m","choices":[{"delta":{"content":7},"finish_reason":"stop"}]}',
        b'{"id":["c1"],"model":"m","choices":[{"delta":{"content":"hi"},"finish_reason":"stop"}]}',
    ],
    ids=[
        "not-an-object",
        "not-json",
        "fragment-without-index",
        "function-not-an-object",
        "bad-usage",
        "mixed-indexes",
        "content-not-a-string",
        "id-not-a-string",
    ],
)
async def test_a_hostile_openai_chunk_is_a_retryable_broken_stream(chunk: bytes) -> None:
    """The adapter reads the chunks' JSON itself (not through the SDK's chunk models): whatever a
    server sends there ends as a `ProviderError`, never as another exception."""
    with as_is_server(b"data: " + chunk + b"\n\ndata: [DONE]\n\n") as url:
        provider = OpenAIProvider("test", f"{url}/v1", max_retries=0)
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(_request(Sink()))
            assert caught.value.retryable and "stream broke" in caught.value.message
        finally:
            await provider.aclose()


def _sse(*events: tuple[str | None, str]) -> bytes:
    return b"".join(
        ((f"event: {name}\n" if name else "") + f"data: {data}\n\n").encode() for name, data in events
    )


_A_START = (
    "message_start",
    '{"type":"message_start","message":{"id":"msg_1","model":"claude-x","usage":{"input_tokens":9,"output_tokens":1}}}',
)
_A_TEXT = (
    "content_block_start",
    '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
)
_A_DELTA = (
    "content_block_delta",
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}',
)
_A_END = (
    "message_delta",
    '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}',
)
_A_STOP = ("message_stop", '{"type":"message_stop"}')


def _A_TOOL(index: str) -> tuple[str, str]:
    """A tool_use block's start at `index` (its JSON text: `0`, or `"1"` for a hostile one)."""
    call = json.dumps({"type": "tool_use", "id": f"t{len(index)}", "name": "f", "input": {}})
    return ("content_block_start", f'{{"type":"content_block_start","index":{index},"content_block":{call}}}')


async def _anthropic_raw(body: bytes) -> LlmResponse:
    with as_is_server(body) as url:
        provider = AnthropicProvider("test", url, max_retries=0)
        try:
            return await provider.complete(_request(Sink()))
        finally:
            await provider.aclose()


@pytest.mark.parametrize(
    "events",
    [
        [_A_START, ("content_block_start", '"just a string"')],
        [_A_START, ("content_block_delta", "{not json")],
        [("message_start", '{"type":"message_start","message":{"id":"m","usage":{}}}')],
        [
            _A_START,
            (
                "content_block_delta",
                '{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}',
            ),
        ],
        [
            _A_START,
            _A_TEXT,
            (
                "content_block_delta",
                '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":7}}',
            ),
        ],
        [
            _A_START,
            _A_TEXT,
            ("message_delta", '{"type":"message_delta","delta":{},"usage":{"output_tokens":"many"}}'),
        ],
        [_A_START, _A_TEXT, _A_DELTA],
        [
            _A_START,
            _A_TEXT,
            _A_DELTA,
            ("error", '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'),
        ],
        [_A_START, _A_TEXT, ("error", "not json at all")],
        [  # two tool calls whose indexes cannot be ordered (int and str), then a proper end
            _A_START,
            _A_TOOL("0"),
            _A_TOOL('"1"'),
            _A_END,
            _A_STOP,
        ],
        [
            _A_START,
            _A_TEXT,
            _A_DELTA,
            ("message_delta", '{"type":"message_delta","delta":{"stop_reason":["end_turn"]}}'),
            _A_STOP,
        ],
        [
            _A_START,
            _A_TEXT,
            _A_DELTA,
            ("message_delta", '{"type":"message_delta","delta":{"stop_reason":5}}'),
            _A_STOP,
        ],
    ],
    ids=[
        "not-an-object",
        "not-json",
        "message-without-model",
        "delta-without-index",
        "text-not-a-string",
        "bad-usage",
        "truncated-before-message_stop",
        "overloaded-error-mid-stream",
        "error-not-json",
        "mixed-indexes",
        "stop-reason-a-list",
        "stop-reason-a-number",
    ],
)
async def test_a_hostile_or_broken_anthropic_stream_is_a_retryable_broken_stream(
    events: list[tuple[str | None, str]],
) -> None:
    """The adapter reads the Messages API's events as JSON itself (not through the SDK's event
    models): whatever a server sends there ends as a retryable `ProviderError`, never as another
    exception; an `event: error` says what the server said, as the SDK's stream did."""
    with pytest.raises(ProviderError) as caught:
        await _anthropic_raw(_sse(*events))
    assert caught.value.retryable and "stream broke" in caught.value.message
    if events[-1][0] == "error":
        said = "overloaded_error" if "Overloaded" in events[-1][1] else "not json at all"
        assert said in caught.value.message


async def test_an_anthropic_stream_skips_pings_comments_and_event_types_it_does_not_know() -> None:
    body = b": a comment\n\n" + _sse(
        _A_START,
        ("ping", '{"type":"ping"}'),
        ("some_future_event", '{"type":"some_future_event","index":0}'),
        (None, '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"unnamed"}}'),
        _A_TEXT,
        _A_DELTA,
        ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"future_delta"}}'),
        ("content_block_stop", '{"type":"content_block_stop","index":0}'),
        _A_END,
        _A_STOP,
    )
    response = await _anthropic_raw(body)
    assert response.text == "hi"  # the unnamed event was skipped, as the SDK's stream skips it
    assert (response.model, response.response_id, response.finish_reason) == ("claude-x", "msg_1", "stop")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (9, 3)


async def test_an_anthropic_event_split_over_several_data_lines_is_one_event() -> None:
    split = (
        'data: {"type":"content_block_delta","index":0,\ndata: "delta":{"type":"text_delta","text":"hi"}}\n\n'
    )
    body = _sse(_A_START, _A_TEXT) + b"event: content_block_delta\n" + split.encode() + _sse(_A_END, _A_STOP)
    assert (await _anthropic_raw(body)).text == "hi"
