"""A deterministic provider with no network, for offline demos, tests and benchmarks.

Without a script it plays a tiny, predictable agent: on the first turn of a conversation with
tools it calls every tool once (in parallel; a tool named to remove, delete, clear... only when
the prompt asks for that), with arguments plausible for each tool's schema
(`stevora/llm/plausible_arguments.py`), and once results are in it answers, quoting them.
It honours `tool_choice`: `none` answers at once, a named tool is the only one called.
With a script it returns the given responses in order (an exception in the script is raised
instead, e.g. a retryable `ProviderError` to exercise fallback).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from collections.abc import Iterable
from typing import Any

from stevora.errors import ProviderError
from stevora.llm.messages import LlmRequest, LlmResponse, Message, NamedTool, ToolCall, Usage
from stevora.llm.plausible_arguments import Seed, leaves_out, synthesize_value

__all__ = ["ScriptedProvider", "scripted_response", "scripted_rounds", "synthesize_value"]

ScriptItem = LlmResponse | Exception

_RESULT_PREVIEW_CHARS = 200
_STRING_SEED_CHARS = 60
_STREAM_PIECE_CHARS = 24  # a delayed answer's text is "streamed" in pieces this long


class ScriptedProvider:
    """`Provider` that answers from a script or from the built-in rules above.

    Given a `script`, running out of it is an error (a test asked for more calls than it
    planned). Without one, answers queued later with `enqueue` come first and the built-in
    rules answer the rest. `requests` keeps the most recent `record_limit` requests.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] | None = None,
        *,
        name: str = "scripted",
        latency_s: float = 0.0,
        record_limit: int = 1000,
    ) -> None:
        if isinstance(script, str):
            raise TypeError("ScriptedProvider's first argument is the script; pass name= by keyword")
        self.name = name
        self.latency_s = latency_s
        self._strict = script is not None
        self._script: deque[ScriptItem] = deque(script or ())
        self._calls = 0
        self.requests: deque[LlmRequest] = deque(maxlen=record_limit)

    def enqueue(self, *items: ScriptItem) -> None:
        self._script.extend(items)

    async def complete(self, request: LlmRequest) -> LlmResponse:
        self.requests.append(request)
        self._calls += 1
        answer = self._next(request)
        if self.latency_s > 0:
            await self._take_time(answer, request)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _next(self, request: LlmRequest) -> ScriptItem:
        if self._script:
            return self._script.popleft()
        if self._strict:
            return ProviderError(
                f"{self.name}: script exhausted after {self._calls - 1} responses",
                provider=self.name,
                retryable=False,
            )
        return scripted_response(request, provider=self.name, response_id=f"scripted-{self._calls}")

    async def _take_time(self, answer: ScriptItem, request: LlmRequest) -> None:
        """`latency_s`, spent like a stream when someone listens: half to the first token, then
        the text in a few pieces (for the demo's live text). With no latency, nothing is heard."""
        sink = request.sink
        if sink is None or isinstance(answer, Exception) or not (answer.text or answer.tool_calls):
            await asyncio.sleep(self.latency_s)
            return
        await asyncio.sleep(self.latency_s / 2)
        sink.first_token()
        text = answer.text or ""
        pieces = [text[i : i + _STREAM_PIECE_CHARS] for i in range(0, len(text), _STREAM_PIECE_CHARS)]
        for piece in pieces:
            sink.text(piece)
            await asyncio.sleep(self.latency_s / 2 / len(pieces))
        if not pieces:
            await asyncio.sleep(self.latency_s / 2)

    async def aclose(self) -> None:
        return None


def scripted_response(
    request: LlmRequest, *, provider: str = "scripted", response_id: str | None = None
) -> LlmResponse:
    """The built-in rules as a pure function (the fake HTTP server's auto-responder uses them too)."""
    messages = request.messages
    last_user = last_user_text(messages)
    input_tokens = sum(len(m.content or "") for m in messages) // 4
    tool_rounds = sum(1 for m in messages if m.role == "assistant" and m.tool_calls)
    choice = request.tool_choice
    # toolChoice: `none` never calls, `required` / a named tool always call (even past the rounds
    # the model name asks for), a named tool is the only one called.
    offered = [] if choice == "none" else request.tools
    if isinstance(choice, NamedTool):
        offered = [tool for tool in request.tools if tool.name == choice.name]
    else:
        offered = [tool for tool in offered if not leaves_out(tool.name, last_user)] or offered
    forced = choice != "auto" and choice != "none"
    if offered and (forced or tool_rounds < scripted_rounds(request.model)):
        prefix = "call_" if tool_rounds == 0 else f"call_r{tool_rounds + 1}_"
        seed = Seed(last_user, conversation_text(messages))
        calls = [
            ToolCall(
                id=f"{prefix}{index}",
                name=tool.name,
                arguments=json.dumps(synthesize_value(tool.parameters, seed), separators=(",", ":")),
            )
            for index, tool in enumerate(offered, start=1)
        ]
        return LlmResponse(
            text=None,
            tool_calls=calls,
            usage=Usage(input_tokens=input_tokens, output_tokens=5 * len(calls)),
            model=request.model,
            finish_reason="tool_calls",
            response_id=response_id,
            provider=provider,
        )
    if request.response_format == "json" or request.output_schema is not None:
        answer = json.dumps(_json_answer(request.output_schema, last_user))
    else:
        answer = _text_answer(messages, last_user)
    return LlmResponse(
        text=answer,
        tool_calls=[],
        usage=Usage(input_tokens=input_tokens, output_tokens=len(answer) // 4),
        model=request.model,
        finish_reason="stop",
        response_id=response_id,
        provider=provider,
    )


_ROUNDS = re.compile(r"rounds=(\d+)")


def scripted_rounds(model: str) -> int:
    """How many tool rounds to play before answering: `scripted:rounds=5`; default 1."""
    match = _ROUNDS.search(model)
    return max(1, int(match.group(1))) if match else 1


def conversation_text(messages: list[Message]) -> str:
    """The user messages and tool results, where argument values are looked up."""
    return "\n".join(m.content or "" for m in messages if m.role in ("user", "tool"))


def last_user_text(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.role == "user" and message.content:
            return message.content
    return ""


def _json_answer(output_schema: dict[str, Any] | None, seed_text: str) -> dict[str, Any]:
    if not output_schema:
        return {"answer": seed_text[:_STRING_SEED_CHARS] or "example"}
    fields: dict[str, Any] = output_schema
    if output_schema.get("type") == "object" and isinstance(output_schema.get("properties"), dict):
        fields = output_schema["properties"]  # a full JSON Schema rather than the flat field map
    return {
        key: synthesize_value(value, seed_text, key) if _looks_like_schema(value) else "example"
        for key, value in fields.items()
    }


def _looks_like_schema(value: Any) -> bool:
    return isinstance(value, dict) and any(
        k in value for k in ("type", "enum", "const", "properties", "anyOf", "oneOf", "allOf")
    )


def _text_answer(messages: list[Message], last_user: str) -> str:
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    results = [
        f"{m.name or names.get(m.tool_call_id or '', 'tool')}: {_summary(m.content or '')}"
        for m in messages
        if m.role == "tool"
    ]
    answer = f"Scripted answer to: {last_user}."
    if results:
        answer += " Tool results: " + "; ".join(results)
    return answer


_SUMMARY_FIELDS = 5
_LABEL_KEYS = ("title", "name", "id")


def _summary(content: str) -> str:
    """A tool result as an answer would quote it: a JSON object as `key value` pairs, a JSON list
    as its count and first labels, anything else as its first characters (never a JSON text)."""
    try:
        value = json.loads(content)
    except ValueError:
        return content[:_RESULT_PREVIEW_CHARS]
    if isinstance(value, dict):
        pairs = [f"{k} {v}" for k, v in value.items() if isinstance(v, str | int | float | bool)]
        return ", ".join(pairs[:_SUMMARY_FIELDS]) or f"{len(value)} field(s)"
    if isinstance(value, list):
        labels = [
            str(next((item[k] for k in _LABEL_KEYS if isinstance(item.get(k), str)), "")) if isinstance(item, dict)
            else str(item)
            for item in value[:3]
        ]  # fmt: skip
        shown = ", ".join(label for label in labels if label)
        return f"{len(value)} result(s)" + (f" ({shown})" if shown else "")
    return content[:_RESULT_PREVIEW_CHARS]
