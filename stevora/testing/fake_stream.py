"""Streaming for the fake LLM server: any scripted answer, sent as the API's SSE stream.

A request with `"stream": true` gets its answer (the same `FakeResponse` a non-streamed request
would get) cut into the provider's stream events, with real timing: a time to first token, then a
delay between chunks, text split into several pieces and tool arguments into fragments.

* OpenAI Chat Completions: `data: <chat.completion.chunk>` lines, tool-call fragments keyed by
  `index`, a final `choices: []` usage chunk when `stream_options.include_usage` is set, `[DONE]`.
* Anthropic Messages: named events `message_start` ... `message_stop` with `text_delta`,
  `input_json_delta`, `thinking_delta` and `signature_delta` deltas and cumulative usage in
  `message_delta`.
* OpenAI Responses: named events `response.created` ... `response.completed` (the whole answer,
  reasoning items included), each with its `sequence_number`.

Scriptable faults (`streamed(...)`): an error event after N content events (`data: {"error":..}` /
`event: error`) or a dropped connection after N content events (the chunked body never ends).
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from http.server import BaseHTTPRequestHandler

# Which API a route speaks (the fake serves both; `fake_llm.ROUTES`).
Kind = Literal["openai", "anthropic", "responses"]


@dataclass(frozen=True)
class StreamScript:
    """How one answer streams; `None` fields take the server's defaults."""

    first_token_s: float | None = None
    chunk_delay_s: float | None = None
    chunks: int | None = None  # pieces the text is cut into
    error_after: int | None = None  # content events sent before an error event ends the stream
    drop_after: int | None = None  # content events sent before the connection is dropped
    error_message: str = "fake stream failure"


@dataclass
class FakeResponse:
    """One scripted answer. Error responses (`body=None`, status >= 400) get the route's error shape."""

    status: int = 200
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    kind: Kind | None = None
    error_message: str | None = None
    error_type: str | None = None
    disconnect: bool = False
    stream: StreamScript | None = None  # timing and faults when the request asks for a stream


class _Event(NamedTuple):
    name: str | None  # the SSE `event:` name (Anthropic); OpenAI sends none
    data: str
    content: bool  # carries text or a tool-call fragment (counts for timing and faults)


def streamed(
    response: FakeResponse,
    *,
    first_token_s: float | None = None,
    chunk_delay_s: float | None = None,
    chunks: int | None = None,
    error_after: int | None = None,
    drop_after: int | None = None,
) -> FakeResponse:
    """`response`, with how it streams when the request asks for a stream."""
    script = StreamScript(first_token_s, chunk_delay_s, chunks, error_after, drop_after)
    return replace(response, stream=script)


def split_text(text: str, pieces: int) -> list[str]:
    """`text` in up to `pieces` consecutive parts (word boundaries where it can)."""
    if not text:
        return []
    pieces = max(1, min(pieces, len(text)))
    size = -(-len(text) // pieces)
    return [text[i : i + size] for i in range(0, len(text), size)]


def openai_events(body: dict[str, Any], request: dict[str, Any], pieces: int) -> list[_Event]:
    base: dict[str, Any] = {
        k: body[k] for k in ("id", "created", "model", "service_tier", "system_fingerprint") if k in body
    }
    base["object"] = "chat.completion.chunk"
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None, content: bool = True) -> _Event:
        data = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return _Event(None, json.dumps(data), content)

    events = [chunk({"role": "assistant", "content": ""}, content=False)]
    events += [chunk({"content": piece}) for piece in split_text(message.get("content") or "", pieces)]
    for index, call in enumerate(message.get("tool_calls") or ()):
        head = {"index": index, "id": call["id"], "type": "function"}
        events.append(
            chunk({"tool_calls": [{**head, "function": {"name": call["function"]["name"], "arguments": ""}}]})
        )
        for piece in split_text(call["function"]["arguments"], 2):
            events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    events.append(chunk({}, choice["finish_reason"], content=False))
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(_Event(None, json.dumps({**base, "choices": [], "usage": body.get("usage")}), False))
    events.append(_Event(None, "[DONE]", False))
    return events


def anthropic_events(body: dict[str, Any], pieces: int) -> list[_Event]:
    def event(name: str, data: dict[str, Any], content: bool = False) -> _Event:
        return _Event(name, json.dumps({"type": name, **data}), content)

    usage = body["usage"]
    start_usage = {**usage, "output_tokens": 1}
    events = [
        event(
            "message_start", {"message": {**body, "content": [], "stop_reason": None, "usage": start_usage}}
        )
    ]
    for index, block in enumerate(body["content"]):
        if block["type"] == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            events.append(event("content_block_start", {"index": index, "content_block": opened}))
            for piece in split_text(block["thinking"], pieces):
                delta = {"type": "thinking_delta", "thinking": piece}
                events.append(event("content_block_delta", {"index": index, "delta": delta}, True))
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append(event("content_block_delta", {"index": index, "delta": delta}))
        elif block["type"] == "redacted_thinking":
            events.append(event("content_block_start", {"index": index, "content_block": block}, True))
        elif block["type"] == "text":
            events.append(
                event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
            )
            if index == 0:
                events.append(event("ping", {}))
            for piece in split_text(block["text"], pieces):
                delta = {"type": "text_delta", "text": piece}
                events.append(event("content_block_delta", {"index": index, "delta": delta}, True))
        else:
            start = {**block, "input": {}}
            events.append(event("content_block_start", {"index": index, "content_block": start}, True))
            for piece in ["", *split_text(json.dumps(block["input"]), 2)]:
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(event("content_block_delta", {"index": index, "delta": delta}, True))
        events.append(event("content_block_stop", {"index": index}))
    ending: dict[str, Any] = {"stop_reason": body["stop_reason"], "stop_sequence": body.get("stop_sequence")}
    cumulative = {
        k: usage[k]
        for k in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "output_tokens_details",
        )
        if k in usage
    }
    events.append(event("message_delta", {"delta": ending, "usage": cumulative}))
    events.append(event("message_stop", {}))
    return events


def complete_body(body: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The scripted body with what the API echoes from the request (tools, choice, parallelism)."""
    return {
        **body,
        "tools": request.get("tools") or [],
        "tool_choice": request.get("tool_choice") or "auto",
        "parallel_tool_calls": bool(request.get("parallel_tool_calls", True)),
    }


def responses_events(body: dict[str, Any], pieces: int) -> list[_Event]:
    """A Responses API answer as its stream's events, each with its `sequence_number`."""
    seq = itertools.count(0)
    events: list[_Event] = []

    def event(name: str, data: dict[str, Any], content: bool = False) -> None:
        events.append(_Event(name, json.dumps({"type": name, "sequence_number": next(seq), **data}), content))

    started = {**body, "status": "in_progress", "output": [], "usage": None}
    event("response.created", {"response": started})
    event("response.in_progress", {"response": started})
    for index, item in enumerate(body["output"]):
        if item["type"] == "message":
            event(
                "response.output_item.added",
                {"output_index": index, "item": {**item, "content": [], "status": "in_progress"}},
            )
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            event(
                "response.content_part.added",
                {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
            )
            for piece in split_text(text, pieces):
                delta = {
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }
                event("response.output_text.delta", delta, True)
            done = {
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "text": text,
                "logprobs": [],
            }
            event("response.output_text.done", done)
            event(
                "response.content_part.done",
                {
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": {**part, "text": text},
                },
            )
        elif item["type"] == "function_call":
            event(
                "response.output_item.added",
                {"output_index": index, "item": {**item, "arguments": "", "status": "in_progress"}},
                True,
            )
            for piece in split_text(item["arguments"], 2):
                event(
                    "response.function_call_arguments.delta",
                    {"item_id": item["id"], "output_index": index, "delta": piece},
                    True,
                )
            event(
                "response.function_call_arguments.done",
                {
                    "item_id": item["id"],
                    "output_index": index,
                    "name": item["name"],
                    "arguments": item["arguments"],
                },
            )
        else:
            event("response.output_item.added", {"output_index": index, "item": item})
        event("response.output_item.done", {"output_index": index, "item": item})
    event("response.completed", {"response": body})
    return events


def _error_event(kind: Kind, message: str) -> _Event:
    if kind == "responses":
        failure: dict[str, Any] = {
            "type": "error",
            "code": "server_error",
            "message": message,
            "param": None,
            "sequence_number": 0,
        }
        return _Event("error", json.dumps(failure), False)
    if kind == "openai":
        return _Event(
            None,
            json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": None}}),
            False,
        )
    data = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
    return _Event("error", json.dumps(data), False)


@dataclass(frozen=True)
class StreamDefaults:
    """A server's streaming timing unless a response's `StreamScript` says otherwise."""

    first_token_s: float = 0.0
    chunk_delay_s: float = 0.0
    chunks: int = 3


def write_stream(
    handler: BaseHTTPRequestHandler,
    kind: Kind,
    response: FakeResponse,
    request: dict[str, Any],
    defaults: StreamDefaults,
    closing: threading.Event,
    headers: dict[str, str],
) -> None:
    """Send `response` (a 200 with a body) as an SSE stream in chunked transfer encoding.

    A stream that ends properly keeps the connection alive (the SDKs pool it, as with the real
    APIs); only a scripted drop, a client that hung up or the server closing ends the connection.
    """
    assert response.body is not None
    script = response.stream or StreamScript()
    pieces = script.chunks or defaults.chunks
    first_s = defaults.first_token_s if script.first_token_s is None else script.first_token_s
    delay_s = defaults.chunk_delay_s if script.chunk_delay_s is None else script.chunk_delay_s
    if kind == "responses":
        events = responses_events(complete_body(response.body, request), pieces)
    else:
        events = (
            openai_events(response.body, request, pieces)
            if kind == "openai"
            else anthropic_events(response.body, pieces)
        )
    try:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream; charset=utf-8")
        handler.send_header("cache-control", "no-cache")
        handler.send_header("transfer-encoding", "chunked")
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        sent_content = 0
        for event in events:
            if event.content:
                if script.drop_after is not None and sent_content >= script.drop_after:
                    handler.wfile.flush()
                    handler.close_connection = True
                    return  # no terminating chunk: the client sees a broken body
                if script.error_after is not None and sent_content >= script.error_after:
                    _write_chunk(handler, _error_event(kind, script.error_message))
                    break
                wait_s = first_s if sent_content == 0 else delay_s
                if wait_s > 0 and closing.wait(wait_s):
                    handler.close_connection = True
                    return
                sent_content += 1
            _write_chunk(handler, event)
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
    except OSError:
        handler.close_connection = True  # the client hung up (timeout, cancelled run)


def _write_chunk(handler: BaseHTTPRequestHandler, event: _Event) -> None:
    text = (f"event: {event.name}\n" if event.name else "") + f"data: {event.data}\n\n"
    data = text.encode()
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()
