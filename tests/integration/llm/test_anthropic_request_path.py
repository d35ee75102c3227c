"""The Anthropic adapter's request path kept lean (docs/benchmarks.md, "The real path, counted"):
the SDK's request options built once per timeout, and a stream read from its raw bytes when it has
no content encoding (decoded by httpx when it has one, or served from the body when already read)."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic._models import FinalRequestOptions

from stevora.llm import anthropic_provider, wire_json
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.messages import LlmRequest, Message, ToolCall

_EVENTS: list[tuple[str, dict[str, Any]]] = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 7, "output_tokens": 1},
            },
        },
    ),
    ("ping", {"type": "ping"}),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "hi \u2028there"},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
    ),
    ("message_stop", {"type": "message_stop"}),
]
_STREAM = "".join(
    f"event: {name}\r\ndata: {json.dumps(data, ensure_ascii=False)}\r\n\r\n" for name, data in _EVENTS
).encode()


class _Chunks(httpx2.AsyncByteStream):
    """A body arriving in pieces of `size` bytes, not read until the adapter reads it."""

    def __init__(self, body: bytes, size: int) -> None:
        self._body, self._size = body, size

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self._body), self._size):
            yield self._body[start : start + self._size]


def _provider(answer: Callable[[httpx2.Request], httpx2.Response]) -> AnthropicProvider:
    transport = httpx2.MockTransport(answer)
    client = anthropic.AsyncAnthropic(
        api_key="k", base_url="http://model.test", http_client=httpx2.AsyncClient(transport=transport)
    )
    return AnthropicProvider("k", client=client, stream=True)


def _request() -> LlmRequest:
    return LlmRequest(model="claude-haiku-4-5", messages=[Message.user("Hi")], timeout_s=10.0)


async def test_a_stream_without_a_content_encoding_is_read_from_its_raw_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(httpx2.Response, "aiter_bytes", lambda *_: pytest.fail("decoded bytes read"))
    for size in (1, 7, 64, len(_STREAM)):  # lines and CRLFs cut anywhere
        provider = _provider(
            lambda _, size=size: httpx2.Response(  # type: ignore[misc]
                200, headers={"content-type": "text/event-stream"}, stream=_Chunks(_STREAM, size)
            )
        )
        response = await provider.complete(_request())
        assert (response.text, response.finish_reason) == ("hi \u2028there", "stop")
        assert (response.usage.input_tokens, response.usage.output_tokens) == (7, 3)
        await provider.aclose()


@pytest.mark.parametrize("kind", ["gzip", "already read"])
async def test_a_stream_with_a_content_encoding_or_already_read_is_read_as_httpx_decodes_it(
    kind: str,
) -> None:
    def answer(_: httpx2.Request) -> httpx2.Response:
        if kind == "gzip":
            body = gzip.compress(_STREAM)
            headers = {"content-type": "text/event-stream", "content-encoding": "gzip"}
            return httpx2.Response(200, headers=headers, stream=_Chunks(body, 16))
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=_STREAM)

    provider = _provider(answer)
    response = await provider.complete(_request())
    assert (response.text, response.finish_reason, response.usage.output_tokens) == (
        "hi \u2028there",
        "stop",
        3,
    )
    await provider.aclose()


async def test_the_sdks_request_options_are_built_once_per_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FinalRequestOptions.construct` (~200 Python calls) runs once per timeout, not per call:
    later calls copy the options with their own body."""
    built: list[dict[str, Any]] = []
    construct = FinalRequestOptions.construct

    def counted(**values: Any) -> FinalRequestOptions:
        built.append(values)
        return construct(**values)

    monkeypatch.setattr(FinalRequestOptions, "construct", counted)
    bodies: list[bytes] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        bodies.append(request.read())
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_Chunks(_STREAM, 64)
        )

    provider = _provider(answer)
    for text in ("one", "two", "three"):
        request = LlmRequest(model="claude-haiku-4-5", messages=[Message.user(text)], timeout_s=10.0)
        assert (await provider.complete(request)).text == "hi \u2028there"
    assert len(built) == 1 and built[0]["timeout"] == 10.0
    client = provider.client
    assert type(anthropic_provider._request_options(client, 30, b"").timeout) is int  # type: ignore[union-attr]
    assert type(anthropic_provider._request_options(client, 30.0, b"").timeout) is float  # type: ignore[union-attr]
    sent = [json.loads(body)["messages"][0]["content"] for body in bodies]
    assert sent == [[{"type": "text", "text": text}] for text in ("one", "two", "three")]
    await provider.aclose()


@pytest.mark.parametrize("cache_key", [None, "run_1"])
async def test_a_tool_loops_earlier_blocks_are_encoded_once_and_the_body_stays_the_sdks(
    monkeypatch: pytest.MonkeyPatch, cache_key: str | None
) -> None:
    """Round after round, only the blocks new to the transcript (and those a cache breakpoint
    marks, which change) are encoded; the body is still, byte for byte, what the encoder writes
    for the whole of `create`'s arguments."""
    encoded: list[Any] = []

    class Counting(json.JSONEncoder):
        def encode(self, o: Any) -> str:
            encoded.append(o)
            return super().encode(o)

    counting = Counting(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    monkeypatch.setattr(wire_json, "ENCODER", counting)
    monkeypatch.setattr(anthropic_provider, "ENCODER", counting)
    whole = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    bodies: list[bytes] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        bodies.append(request.read())
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_Chunks(_STREAM, 64)
        )

    provider = _provider(answer)
    transcript = [Message.system("Be terse."), Message.user("Find it, ünïcode kept.")]
    blocks_per_round = []
    for round_ in range(3):
        request = LlmRequest(
            model="claude-haiku-4-5", messages=list(transcript), timeout_s=10.0, cache_key=cache_key
        )
        encoded.clear()
        await provider.complete(request)
        kwargs = provider.build_kwargs(request)
        # `create`'s order: max_tokens, messages, model, stream, system.
        expected = {key: kwargs[key] for key in ("max_tokens", "messages", "model")}
        expected |= {"stream": True, "system": kwargs["system"]}
        assert bodies[-1] == whole.encode(expected).encode()
        assert not any(isinstance(o, dict) and "messages" in o for o in encoded)  # never the whole body
        blocks_per_round.append(sum(1 for o in encoded if isinstance(o, dict) and "type" in o))
        call = f"toolu_{round_}"
        transcript += [
            Message.assistant(tool_calls=[ToolCall(call, "lookup", json.dumps({"q": round_}))]),
            Message.tool_result(call, f"row {round_}"),
        ]
    # Without a cache key: round 1's one block, then the two blocks each round adds. With one,
    # the blocks a breakpoint marks go as marked copies, encoded each time (round 2: the new
    # tool call, the marked copies of the new result and of the prompt; round 3: the new call,
    # the copies of the two results, and the prompt's own block, encoded once now that it is
    # unmarked).
    assert blocks_per_round == ([1, 2, 2] if cache_key is None else [1, 3, 4])
    await provider.aclose()
