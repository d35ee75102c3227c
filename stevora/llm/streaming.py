"""Streamed model answers: the accumulator both SDK adapters feed, which feeds the request's sink
(`StreamSink`, declared with the request in `messages.py`).

A stream is folded into the same `LlmResponse` a non-streamed call returns (text, tool calls with
their argument fragments joined, usage, finish reason, response model and id), so everything after
the provider call — the stored row, the checkpoint, the transcript — cannot tell the difference.

A stream that breaks after the 200 (an error event, a dropped connection, a stream that ends
before its final chunk) is a *retryable* `ProviderError`: the SDKs retry only before the 200
arrives, so the engine's fallback chain and step retries take over from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx2

from stevora.errors import ProviderError
from stevora.llm.messages import LlmResponse, ReasoningItem, ReasoningKind, StreamSink, ToolCall, Usage
from stevora.llm.provider import MALFORMED, checked_response

__all__ = ["BROKEN_STREAM", "StreamAccumulator", "StreamSink"]

# What breaks a stream after its 200 besides the SDK's own errors: a dropped connection or a read
# timeout (httpx, the socket), or an event that is not what the API sends, read as JSON by the
# adapters (`MALFORMED`: not valid JSON, not an object, a field missing or of another type).
BROKEN_STREAM: tuple[type[Exception], ...] = (httpx2.HTTPError, OSError, *MALFORMED)


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAccumulator:
    """Collects one streamed answer; `response()` gives the `LlmResponse` it adds up to."""

    def __init__(self, provider: str, sink: StreamSink | None = None) -> None:
        self.provider = provider
        self._sink = sink
        self._texts: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        # Reasoning items by stream index: their kind and fields (string fields grow by deltas).
        self._reasoning: dict[int, tuple[ReasoningKind, dict[str, Any]]] = {}
        self._first_seen = False
        self.usage = Usage()
        self.model = ""
        self.response_id: str | None = None
        self.finish_reason: str | None = None
        self.finished = False  # the stream's own end marker arrived (not just EOF)

    def _first(self) -> None:
        if not self._first_seen:
            self._first_seen = True
            if self._sink is not None:
                self._sink.first_token()

    def text(self, piece: str | None) -> None:
        if not piece:
            return  # the first delta is often "" (and a role-only delta carries None)
        if not isinstance(piece, str):
            raise TypeError(f"a text delta is {type(piece).__name__}, not a string")
        self._first()
        self._texts.append(piece)
        if self._sink is not None:
            self._sink.text(piece)

    def tool_start(self, index: int, call_id: str | None, name: str | None) -> None:
        _index(index)
        self._first()
        call = self._calls.setdefault(index, _PartialCall())
        call.id = call_id or call.id
        call.name = name or call.name

    def tool_arguments(self, index: int, piece: str | None) -> None:
        _index(index)
        if piece:
            self._first()
            self._calls.setdefault(index, _PartialCall()).arguments.append(piece)

    def reasoning_start(self, index: int, kind: ReasoningKind, item: dict[str, Any]) -> None:
        """A thinking block or reasoning item began (its fields may be completed by deltas)."""
        _index(index)
        self._reasoning[index] = (kind, dict(item))

    def reasoning_append(self, index: int, name: str, piece: str | None) -> None:
        entry = self._reasoning.get(index)
        if entry is not None and piece:
            entry[1][name] = str(entry[1].get(name) or "") + piece

    def broken(self, detail: str) -> ProviderError:
        """The error for a stream that failed after the 200: retryable, the SDKs will not resend."""
        return ProviderError(
            f"{self.provider} stream broke after the answer began: {detail}",
            provider=self.provider,
            retryable=True,
        )

    def response(self, finish_reason_if_missing: str) -> LlmResponse:
        """The answer the stream added up to; `TypeError` when a field of it is of another type
        (`checked_response`), for the adapter to raise as `broken`."""
        if not self.finished:
            raise self.broken("the stream ended before its final event")
        calls = [
            ToolCall(id=c.id, name=c.name, arguments="".join(c.arguments))
            for _, c in sorted(self._calls.items())
        ]
        return checked_response(
            LlmResponse(
                text="".join(self._texts) if self._texts else None,
                tool_calls=calls,
                usage=self.usage,
                model=self.model,
                finish_reason=self.finish_reason or finish_reason_if_missing,
                response_id=self.response_id,
                provider=self.provider,
                reasoning=[
                    ReasoningItem.of(kind, item) for _, (kind, item) in sorted(self._reasoning.items())
                ],
            )
        )


def _index(index: object) -> None:
    """Stream indexes key and order the calls and reasoning items: each must be an integer."""
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"a stream index is {type(index).__name__}, not an integer")
