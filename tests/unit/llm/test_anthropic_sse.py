"""The Anthropic adapter reads a stream's events from the body's bytes (`stream_events`): lines
end at CR, LF or CRLF, wherever the chunks happen to split them, as the SDK's SSE decoder reads
them; a JSON string holding U+2028 (a line separator to `str.splitlines`) stays one line."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anthropic
import httpx2
import pytest

from stevora.llm.anthropic_provider import stream_events

_EVENTS = [
    {"type": "message_start", "message": {"id": "m", "model": "c", "usage": {"input_tokens": 1}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a\u2028b\u00e9"}},
    {"type": "message_stop"},
]


def _body(newline: bytes) -> bytes:
    out = b": a comment" + newline + b"event: ping" + newline + b"data: {}" + newline + newline
    for event in _EVENTS:
        data = json.dumps(event, ensure_ascii=False).encode()
        out += b"event: " + event["type"].encode() + newline + b"data: " + data + newline + newline
    return out


async def _read(chunks: list[bytes]) -> list[dict[str, object]]:
    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    answer = httpx2.Response(
        200, content=body(), request=httpx2.Request("POST", "http://llm.test/v1/messages")
    )
    return [event async for event in stream_events(answer)]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
async def test_events_are_the_same_wherever_the_chunks_split_the_lines(newline: bytes) -> None:
    body = _body(newline)
    assert await _read([body]) == _EVENTS
    assert await _read([body[i : i + 1] for i in range(len(body))]) == _EVENTS  # split everywhere
    assert await _read([body[:-1], body[-1:]]) == _EVENTS  # the last line's end alone


async def test_data_over_several_lines_is_joined_and_an_unfinished_event_is_not_read() -> None:
    body = b'event: message_stop\ndata: {"type":\ndata:  "message_stop"}\n\nevent: message_stop\ndata: {}'
    assert await _read([body]) == [{"type": "message_stop"}]


async def test_an_error_event_is_raised_as_the_sdk_raises_it() -> None:
    body = b'event: error\r\ndata: {"type": "error", "error": {"message": "overloaded"}}\r\n\r\n'
    with pytest.raises(anthropic.APIStatusError) as raised:
        await _read([body])
    assert raised.value.body == {"type": "error", "error": {"message": "overloaded"}}


async def test_event_data_is_read_as_utf_8_with_bad_bytes_replaced_and_big_integers_exact() -> None:
    """ASCII data is parsed from its bytes, anything else from its text decoded as the SDK decodes
    it (a bad byte becomes U+FFFD); either way an integer beyond 64 bits stays exact."""
    body = (
        b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
        b'"delta": {"type": "text_delta", "text": "a\xffb\xc3\xa9"}}\n\n'
        b'event: message_delta\ndata: {"type": "message_delta", "n": 18446744073709551616}\n\n'
    )
    first, second = await _read([body])
    assert first["delta"] == {"type": "text_delta", "text": "a\ufffdb\u00e9"}
    assert second["n"] == 2**64 and type(second["n"]) is int
