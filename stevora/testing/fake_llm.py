"""A loopback fake of the OpenAI and Anthropic HTTP APIs for tests, demos and benchmarks.

The real SDKs talk to it over real HTTP (they use `httpx2`, which `respx`-style mocks cannot
see). Bodies built here pass the SDKs' `_strict_response_validation=True`, and requests are
checked the way the real APIs check them (unanswered tool calls, misplaced tool results, missing
`max_tokens`, ...), answering 400 in the provider's own error shape.

    with FakeLLMServer() as server:
        server.openai.enqueue(openai_tool_calls([("call_1", "lookup", '{"q":"x"}')]), openai_text("done"))
        client = AsyncOpenAI(api_key="test", base_url=server.openai_base_url, max_retries=0)
        ...
        assert server.openai.requests[1].json["messages"][-1]["tool_call_id"] == "call_1"
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, NamedTuple

from stevora.llm.messages import (
    LlmRequest,
    Message,
    NamedTool,
    ToolCall,
    ToolChoice,
    ToolSpec,
    tool_choice_of,
)
from stevora.llm.scripted_provider import scripted_response
from stevora.testing.fake_content import content_problem
from stevora.testing.fake_prompt_cache import FakePromptCache
from stevora.testing.fake_rate_limit import FakeRateLimit
from stevora.testing.fake_reasoning import (
    anthropic_answer,
    anthropic_thinking_problem,
    redacted_thinking_block,
    responses_answer,
    thinking_block,
    validate_responses,
)
from stevora.testing.fake_stream import FakeResponse as FakeResponse  # re-exported: the scripted answer
from stevora.testing.fake_stream import Kind, StreamDefaults, complete_body, write_stream
from stevora.testing.fake_structured import answer_mismatch, strict_schema_of, structured_problem

ROUTES: dict[str, Kind] = {
    "/v1/chat/completions": "openai",
    "/v1/messages": "anthropic",
    "/v1/responses": "responses",
}

_ids = itertools.count(1)


Responder = Callable[[dict[str, Any]], "FakeResponse | dict[str, Any]"]


class RecordedRequest(NamedTuple):
    path: str
    headers: dict[str, str]
    json: dict[str, Any]
    raw: bytes = b""  # the body's bytes as the SDK sent them (byte-stability tests compare these)


# --- builders ------------------------------------------------------------------------------


def openai_text(
    text: str,
    *,
    model: str = "gpt-4o-mini",
    usage: Mapping[str, Any] | None = None,
    finish_reason: str = "stop",
    delay_s: float = 0.0,
    headers: Mapping[str, str] | None = None,
) -> FakeResponse:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
    return _openai_completion(message, model, usage, finish_reason, delay_s, headers)


def openai_tool_calls(
    calls: Sequence[tuple[str, str, str]],
    *,
    text: str | None = None,
    model: str = "gpt-4o-mini",
    usage: Mapping[str, Any] | None = None,
    delay_s: float = 0.0,
    headers: Mapping[str, str] | None = None,
) -> FakeResponse:
    """`calls` are `(id, name, arguments_json_string)`; the string is sent as-is, even if malformed."""
    message = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": [],
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}
            for cid, name, arguments in calls
        ],
    }
    return _openai_completion(message, model, usage, "tool_calls", delay_s, headers)


def anthropic_text(
    text: str,
    *,
    model: str = "claude-haiku-4-5",
    usage: Mapping[str, Any] | None = None,
    stop_reason: str = "end_turn",
    delay_s: float = 0.0,
    headers: Mapping[str, str] | None = None,
    thinking: str | None = None,
) -> FakeResponse:
    """A text answer; `thinking`: after a signed thinking block with that text."""
    content = [*_thinking(thinking, False, usage), {"type": "text", "text": text}]
    return _anthropic_message(content, model, _thinking_usage(thinking, usage), stop_reason, delay_s, headers)


def _thinking(thinking: str | None, redacted: bool, usage: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    blocks = [thinking_block(thinking)] if thinking is not None else []
    return [*blocks, redacted_thinking_block()] if redacted else blocks


def _thinking_usage(thinking: str | None, usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Thinking tokens are output tokens, and the usage says how many of them were thinking."""
    if thinking is None:
        return dict(usage) if usage is not None else None
    tokens = max(1, len(thinking) // 4)
    return {
        "output_tokens": 5 + tokens,
        "output_tokens_details": {"thinking_tokens": tokens},
        **(usage or {}),
    }


def anthropic_tool_use(
    calls: Sequence[tuple[str, str, dict[str, Any]]],
    *,
    text: str | None = None,
    model: str = "claude-haiku-4-5",
    usage: Mapping[str, Any] | None = None,
    delay_s: float = 0.0,
    headers: Mapping[str, str] | None = None,
    thinking: str | None = None,
    redacted_thinking: bool = False,
) -> FakeResponse:
    """`calls` are `(id, name, input_object)`; `thinking` (and `redacted_thinking`): signed
    thinking blocks first, as the API answers with thinking enabled."""
    content = _thinking(thinking, redacted_thinking, usage)
    content += [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": cid, "name": name, "input": data} for cid, name, data in calls]
    return _anthropic_message(content, model, _thinking_usage(thinking, usage), "tool_use", delay_s, headers)


def error(
    status: int,
    message: str = "fake error",
    *,
    error_type: str | None = None,
    retry_after_ms: float | None = None,
    retry_after_s: float | None = None,
    should_retry: bool | None = None,
    headers: Mapping[str, str] | None = None,
    delay_s: float = 0.0,
) -> FakeResponse:
    """An error answer, rendered in the shape of whichever API route serves it."""
    out = dict(headers or {})
    if retry_after_ms is not None:
        out["retry-after-ms"] = f"{retry_after_ms:g}"
    if retry_after_s is not None:
        out["retry-after"] = f"{retry_after_s:g}"
    if should_retry is not None:
        out["x-should-retry"] = "true" if should_retry else "false"
    return FakeResponse(
        status=status, headers=out, delay_s=delay_s, error_message=message, error_type=error_type
    )


def disconnect(*, delay_s: float = 0.0) -> FakeResponse:
    """Close the connection without answering (the SDKs see a connection error and retry)."""
    return FakeResponse(disconnect=True, delay_s=delay_s)


def _openai_completion(
    message: dict[str, Any],
    model: str,
    usage: Mapping[str, Any] | None,
    finish_reason: str,
    delay_s: float,
    headers: Mapping[str, str] | None,
) -> FakeResponse:
    merged: dict[str, Any] = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    for key, value in (usage or {}).items():
        merged[key] = {**merged[key], **value} if isinstance(value, Mapping) and key in merged else value
    merged.setdefault("total_tokens", merged["prompt_tokens"] + merged["completion_tokens"])
    body = {
        "id": f"chatcmpl-fake{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": merged,
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }
    return FakeResponse(body=body, headers=dict(headers or {}), delay_s=delay_s, kind="openai")


def _anthropic_message(
    content: list[dict[str, Any]],
    model: str,
    usage: Mapping[str, Any] | None,
    stop_reason: str,
    delay_s: float,
    headers: Mapping[str, str] | None,
) -> FakeResponse:
    merged: dict[str, Any] = {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "service_tier": "standard",
        **(usage or {}),
    }
    body = {
        "id": f"msg_fake{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": merged,
    }
    return FakeResponse(body=body, headers=dict(headers or {}), delay_s=delay_s, kind="anthropic")


# --- error bodies and request validation (what the real APIs answer 400 to) ----------------

_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "requests",
}
_OPENAI_ERROR_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def openai_error_body(status: int, message: str, error_type: str | None = None) -> dict[str, Any]:
    default_type = (
        "server_error" if status >= 500 else _OPENAI_ERROR_TYPES.get(status, "invalid_request_error")
    )
    return {
        "error": {
            "message": message,
            "type": error_type or default_type,
            "param": None,
            "code": _OPENAI_ERROR_CODES.get(status),
        }
    }


def anthropic_error_body(status: int, message: str, error_type: str | None = None) -> dict[str, Any]:
    default_type = _ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return {
        "type": "error",
        "error": {"type": error_type or default_type, "message": message},
        "request_id": f"req_fake{next(_ids)}",
    }


def validate_openai(body: dict[str, Any]) -> str | None:
    """The first problem the Chat Completions API would reject `body` for, or `None`."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    for tool in body.get("tools") or ():
        if tool.get("type") != "function" or not (tool.get("function") or {}).get("name"):
            return "Invalid 'tools': each tool must be {'type': 'function', 'function': {'name': ...}}"
    problem = _openai_tool_choice_problem(body)
    if problem is not None:
        return problem
    json_mode = (body.get("response_format") or {}).get("type") == "json_object"
    if json_mode and "json" not in json.dumps([m.get("content") for m in messages]).lower():
        return "'messages' must contain the word 'json' in some form, to use 'response_format' json_object."
    open_ids: list[str] = []  # calls of the last assistant turn not yet answered
    answered: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role != "tool" and open_ids:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding "
                f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                f"{', '.join(open_ids)}"
            )
        if role == "assistant" and message.get("tool_calls"):
            for j, call in enumerate(message["tool_calls"]):
                if not isinstance((call.get("function") or {}).get("arguments"), str):
                    return f"Invalid type for 'messages[{i}].tool_calls[{j}].function.arguments'"
                if len(str(call.get("id", ""))) > 40:
                    return f"Invalid 'messages[{i}].tool_calls[{j}].id': string too long (maximum length 40)"
            open_ids = [str(call.get("id")) for call in message["tool_calls"]]
            answered = set()
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if i == 0 or (call_id not in open_ids and call_id not in answered):
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                    "message with 'tool_calls'."
                )
            if call_id in open_ids:
                open_ids.remove(call_id)
                answered.add(call_id)
        elif role not in ("system", "developer", "user", "assistant"):
            return f"Invalid value for 'messages[{i}].role': {role!r}"
    if open_ids:
        return f"tool_call_ids without response messages: {', '.join(open_ids)}"
    return None


def _openai_tool_choice_problem(body: dict[str, Any]) -> str | None:
    if "tool_choice" not in body:
        return None
    choice, names = (
        body["tool_choice"],
        [(t.get("function") or {}).get("name") for t in body.get("tools") or ()],
    )
    if not names:
        return "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified."
    if choice in ("none", "auto", "required"):
        return None
    if not (isinstance(choice, dict) and choice.get("type") == "function"):
        return f"Invalid value for 'tool_choice': {json.dumps(choice)}"
    name = (choice.get("function") or {}).get("name")
    if name not in names:
        return f"Invalid value for 'tool_choice': function {name!r} is not one of the tools"
    return None


def _anthropic_tool_choice_problem(body: dict[str, Any]) -> str | None:
    if "tool_choice" not in body:
        return None
    choice, names = body["tool_choice"], [t.get("name") for t in body.get("tools") or ()]
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        return "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"
    if not isinstance(choice.get("disable_parallel_tool_use", False), bool):
        return "tool_choice.disable_parallel_tool_use: Input should be a valid boolean"
    if choice["type"] == "tool" and choice.get("name") not in names:
        return f"tool_choice.name: tool {choice.get('name')!r} is not one of the request's tools"
    if choice["type"] in ("any", "tool") and not names:
        return "tool_choice: tools must be provided when tool_choice is 'any' or 'tool'"
    return None


def validate_llamacpp(body: dict[str, Any]) -> str | None:
    """What llama-cpp-python's server (0.3.x, `chatml-function-calling`) answers 500 to.

    It rejects an assistant `content` that is `null` (pydantic) or missing (its chat template),
    and `tool_choice: "required"`; it takes `""` and the named form (docs/providers.md, "The
    empty-content form").
    """
    for i, message in enumerate(body.get("messages") or ()):
        if message.get("role") != "assistant":
            continue
        if "content" not in message:
            return "'dict object' has no attribute 'content'"
        if message["content"] is None:
            return (
                "7 validation errors:\n  {'type': 'string_type', 'loc': ('body', 'messages', "
                f"{i}, 'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a "
                "valid string', 'input': None}"
            )
    if body.get("tool_choice") == "required":
        return "Invalid tool_choice: 'required'"
    return None


def validate_anthropic(body: dict[str, Any]) -> str | None:
    """The first problem the Messages API would reject `body` for, or `None`."""
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    problem = _anthropic_tool_choice_problem(body) or anthropic_thinking_problem(body)
    if problem is not None:
        return problem
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    pending: list[str] = []  # tool_use ids of the previous assistant turn
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{i}: all messages must have non-empty content"
        kinds = [b.get("type") for b in blocks]
        if any(k == "text" and not b.get("text") for k, b in zip(kinds, blocks, strict=True)):
            return f"messages.{i}: text content blocks must be non-empty"
        if role == "user":
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if results and kinds[: len(results)] != ["tool_result"] * len(results):
                return (
                    f"messages.{i}: tool_result blocks must come first in the content, before any other block"
                )
            for j, block in enumerate(results):
                if block.get("tool_use_id") not in pending:
                    return (
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )
            missing = [p for p in pending if p not in {b.get("tool_use_id") for b in results}]
        else:
            missing = pending
        if missing:
            return (
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                "in the next message."
            )
        pending = []
        if role == "assistant":
            for j, block in enumerate(blocks):
                if block.get("type") != "tool_use":
                    continue
                if not _TOOL_USE_ID.match(str(block.get("id", ""))):
                    return f"messages.{i}.content.{j}.tool_use.id: String should match '^[a-zA-Z0-9_-]+$'"
                if not isinstance(block.get("input"), dict):
                    return f"messages.{i}.content.{j}.tool_use.input: Input should be a valid dictionary"
                pending.append(str(block["id"]))
    return None


def prompt_tokens(body: dict[str, Any]) -> int:
    """The fake's token count of a request's prompt: characters / 4 of its tools, system and
    messages (Responses: `instructions` and `input`)."""
    parts = (body.get("tools"), body.get("system"), body.get("messages"))
    if "input" in body:
        parts = (body.get("tools"), body.get("instructions"), body.get("input"))
    return len(json.dumps(parts, ensure_ascii=False)) // 4


def _over_window(kind: Kind, body: dict[str, Any], window: int) -> FakeResponse | None:
    """The provider's 400 for a prompt over the model's context window, in its own words."""
    tokens = prompt_tokens(body)
    if tokens <= window:
        return None
    if kind != "anthropic":
        message = (
            f"This model's maximum context length is {window} tokens. However, your messages resulted "
            f"in {tokens} tokens. Please reduce the length of the messages."
        )
        return FakeResponse(status=400, error_message=message, error_type="invalid_request_error")
    message = f"prompt is too long: {tokens} tokens > {window} maximum"
    return FakeResponse(status=400, error_message=message, error_type="invalid_request_error")


# --- a responder that plays the scripted agent over HTTP (load tests, demos) ----------------


def scripted_responder(kind: Kind, *, delay_s: float = 0.0) -> Responder:
    """Answer like `ScriptedProvider`: call every tool once on the first turn, then a final text."""

    def respond(body: dict[str, Any]) -> FakeResponse:
        request = _neutral_request(kind, body)
        answer = scripted_response(request, provider=kind)
        usage = answer.usage
        if kind == "openai":
            openai_usage = {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens}
            if answer.tool_calls:
                calls = [(c.id, c.name, c.arguments) for c in answer.tool_calls]
                return openai_tool_calls(calls, model=request.model, usage=openai_usage, delay_s=delay_s)
            return openai_text(answer.text or "", model=request.model, usage=openai_usage, delay_s=delay_s)
        anthropic_usage = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
        if answer.tool_calls:
            uses = [(c.id, c.name, json.loads(c.arguments)) for c in answer.tool_calls]
            return anthropic_tool_use(uses, model=request.model, usage=anthropic_usage, delay_s=delay_s)
        return anthropic_text(answer.text or "", model=request.model, usage=anthropic_usage, delay_s=delay_s)

    return respond


def _neutral_request(kind: Kind, body: dict[str, Any]) -> LlmRequest:
    messages: list[Message] = []
    tools: list[ToolSpec] = []
    if kind == "openai":
        for m in body.get("messages", []):
            calls = tuple(
                ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in m.get("tool_calls") or ()
            )
            content = m.get("content") if isinstance(m.get("content"), str) else None
            messages.append(
                Message(
                    role=m["role"] if m["role"] != "developer" else "system",
                    content=content,
                    tool_calls=calls,
                    tool_call_id=m.get("tool_call_id"),
                )
            )
        tools = [
            ToolSpec(
                t["function"]["name"],
                t["function"].get("description", ""),
                t["function"].get("parameters") or {},
            )
            for t in body.get("tools") or ()
        ]
    else:
        for m in body.get("messages", []):
            blocks = (
                [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]
            )
            for b in blocks:
                if b["type"] == "tool_result":
                    result = b["content"] if isinstance(b["content"], str) else json.dumps(b["content"])
                    messages.append(Message.tool_result(b["tool_use_id"], result))
            text = "".join(b.get("text", "") for b in blocks if b["type"] == "text") or None
            calls = tuple(
                ToolCall(b["id"], b["name"], json.dumps(b["input"]))
                for b in blocks
                if b["type"] == "tool_use"
            )
            if text or calls:
                messages.append(Message(role=m["role"], content=text, tool_calls=calls))
        tools = [
            ToolSpec(t["name"], t.get("description", ""), t.get("input_schema") or {})
            for t in body.get("tools") or ()
        ]
    return LlmRequest(
        model=str(body.get("model", "")),
        messages=messages,
        tools=tools,
        tool_choice=_neutral_choice(body),
        output_schema=strict_schema_of(kind, body),
    )


def _neutral_choice(body: dict[str, Any]) -> ToolChoice:
    """The provider-neutral form of either API's `tool_choice` (both validated before this)."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return tool_choice_of(choice)
    kind = choice.get("type")
    if kind == "function":
        return NamedTool(choice["function"]["name"])
    if kind == "tool":
        return NamedTool(choice["name"])
    return {"any": "required", "none": "none"}.get(str(kind), "auto")  # type: ignore[return-value]


# --- server --------------------------------------------------------------------------------


class ProviderScript:
    """The FIFO script, optional responder and journal view for one API (`server.openai` ...)."""

    def __init__(self, server: FakeLLMServer, kind: Kind) -> None:
        self._server = server
        self.kind = kind
        self.responder: Responder | None = None

    def enqueue(self, *responses: FakeResponse) -> None:
        """Queue answers for this API only, in order."""
        for response in responses:
            if response.kind not in (None, self.kind):
                raise ValueError(f"a {response.kind} response cannot be queued for {self.kind}")
        with self._server._lock:
            self._server._queue.extend((self.kind, response) for response in responses)

    @property
    def pending(self) -> int:
        """Queued answers this API would serve (its own and those for either API)."""
        with self._server._lock:
            return sum(1 for kind, _ in self._server._queue if kind in (None, self.kind))

    @property
    def requests(self) -> list[RecordedRequest]:
        return [r for r in self._server.requests if ROUTES.get(r.path) == self.kind]

    def _reset(self) -> None:
        self.responder = None


class FakeLLMServer:
    """Threaded HTTP/1.1 server on 127.0.0.1 with an OpenAI and an Anthropic route."""

    def __init__(
        self,
        *,
        responder: Responder | None = None,
        latency_s: float = 0.0,
        validate: bool = True,
        require_auth: bool = True,
        openai_dialect: Literal["openai", "llamacpp"] = "openai",
        stream: StreamDefaults | None = None,
    ) -> None:
        self.responder = responder
        # How answers to `"stream": true` requests are timed (settable per test).
        self.stream = stream or StreamDefaults()
        # "llamacpp": the OpenAI route also answers like llama-cpp-python's server does to what it
        # cannot take (a 500 whose body is a validation message; see `validate_llamacpp`).
        self.openai_dialect = openai_dialect
        self.latency_s = latency_s  # added to every answer; 0 is the benchmark's zero-latency mode
        self.validate = validate
        self.require_auth = require_auth
        self.requests: list[RecordedRequest] = []
        # The enforcing mode: requests and tokens per window, 429 beyond (None: no limit).
        self.rate_limit: FakeRateLimit | None = None
        # Prefix caching as the providers document it (None: every answer reports what it was scripted with).
        self.prompt_cache: FakePromptCache | None = None
        # The model's context window in tokens (characters / 4 of the prompt): a longer prompt gets
        # the provider's own 400 (None: no window).
        self.context_window_tokens: int | None = None
        # Per request, the client's port: the same one again means a kept-alive connection reused.
        self.client_ports: list[int] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        # One FIFO for both APIs: (target API or None for either, answer).
        self._queue: deque[tuple[Kind | None, FakeResponse]] = deque()
        self.openai = ProviderScript(self, "openai")
        self.anthropic = ProviderScript(self, "anthropic")
        self.responses = ProviderScript(self, "responses")  # OpenAI's Responses API (/v1/responses)
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-llm", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    def enqueue(self, *responses: FakeResponse) -> None:
        """Queue in order; a response serves its own API, kind-less ones (errors...) either API."""
        with self._lock:
            self._queue.extend((response.kind, response) for response in responses)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.client_ports.clear()
            self._queue.clear()
            self.openai._reset()
            self.anthropic._reset()
            self.responses._reset()
            self.responder = None
            self.rate_limit = None
            self.prompt_cache = None
            self.context_window_tokens = None

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeLLMServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _script(self, kind: Kind) -> ProviderScript:
        return {"openai": self.openai, "anthropic": self.anthropic, "responses": self.responses}[kind]

    def _answer(
        self,
        kind: Kind,
        path: str,
        headers: dict[str, str],
        body: dict[str, Any],
        client_port: int = 0,
        raw: bytes = b"",
    ) -> FakeResponse:
        answer = self._answer_unpriced(kind, path, headers, body, client_port, raw)
        cache = self.prompt_cache
        counted = cache is not None or self.context_window_tokens is not None
        if kind == "responses" and answer.body is not None and answer.status == 200:
            shaped = complete_body(responses_answer(body, answer.body), body)
            usage = shaped.get("usage")
            if counted and isinstance(usage, dict):  # the prompt's own count, as on the other APIs
                output = int(usage.get("output_tokens") or 0)
                tokens = prompt_tokens(body)
                shaped["usage"] = {**usage, "input_tokens": tokens, "total_tokens": tokens + output}
            return dataclasses.replace(answer, body=shaped)
        if kind == "anthropic" and answer.body is not None and answer.status == 200 and self.validate:
            answer = dataclasses.replace(answer, body=anthropic_answer(body, answer.body))
        if not counted or answer.status != 200 or answer.body is None or "usage" not in answer.body:
            return answer
        # The usage a real API would report for this prompt, not the scripted one.
        usage = dict(answer.body["usage"])
        if kind == "openai":
            prompt, cached = cache.openai_usage(body) if cache is not None else (prompt_tokens(body), 0)
            details = {**(usage.get("prompt_tokens_details") or {}), "cached_tokens": cached}
            usage.update(prompt_tokens=prompt, prompt_tokens_details=details)
            usage["total_tokens"] = prompt + int(usage.get("completion_tokens") or 0)
        elif cache is not None:
            usage.update(cache.anthropic_usage(body))
        else:
            usage["input_tokens"] = prompt_tokens(body)
        return dataclasses.replace(answer, body={**answer.body, "usage": usage})

    def _answer_unpriced(
        self,
        kind: Kind,
        path: str,
        headers: dict[str, str],
        body: dict[str, Any],
        client_port: int,
        raw: bytes,
    ) -> FakeResponse:
        with self._lock:
            self.requests.append(RecordedRequest(path, headers, body, raw))
            self.client_ports.append(client_port)
        if self.require_auth and not (headers.get("authorization", "").strip() or headers.get("x-api-key")):
            return FakeResponse(status=401, error_message="missing API key", kind=None)
        if self.validate:
            problem = {
                "openai": validate_openai,
                "anthropic": validate_anthropic,
                "responses": validate_responses,
            }[kind](body)
            problem = problem or structured_problem(kind, body) or content_problem(kind, body)
            if problem is not None:
                return FakeResponse(status=400, error_message=problem, error_type="invalid_request_error")
            if kind == "openai" and self.openai_dialect == "llamacpp":
                problem = validate_llamacpp(body)
                if problem is not None:
                    return FakeResponse(status=500, error_message=problem, error_type="internal_server_error")
        window = self.context_window_tokens
        if window is not None:
            too_long = _over_window(kind, body, window)
            if too_long is not None:
                return too_long
        limit = self.rate_limit
        if limit is None:
            return self._scripted(kind, path, body)
        refusal, reserved = limit.admit(kind, body)
        if refusal is not None:
            return refusal
        answer = self._scripted(kind, path, body)
        limit.settle(reserved, answer)
        return answer

    def _scripted(self, kind: Kind, path: str, body: dict[str, Any]) -> FakeResponse:
        """The scripted answer, refused when a real strict-mode answer could not look like it."""
        answer = self._scripted_unchecked(kind, path, body)
        if answer.status == 200 and answer.body is not None:
            mismatch = answer_mismatch(kind, body, answer.body)
            if mismatch is not None:
                return FakeResponse(status=500, error_message=f"FakeLLMServer: {mismatch}", kind=None)
        return answer

    def _scripted_unchecked(self, kind: Kind, path: str, body: dict[str, Any]) -> FakeResponse:
        """The queued answer, else the responder's."""
        with self._lock:
            queued = next((entry for entry in self._queue if entry[0] in (None, kind)), None)
            if queued is not None:
                self._queue.remove(queued)
        if queued is not None:
            return queued[1]
        responder = self._script(kind).responder or self.responder
        if responder is None:
            return FakeResponse(
                status=500,
                error_message=f"FakeLLMServer: nothing scripted for POST {path}",
            )
        try:
            answer = responder(body)
        except Exception as exc:  # surface responder bugs to the test through the HTTP answer
            return FakeResponse(status=500, error_message=f"FakeLLMServer responder failed: {exc!r}")
        return answer if isinstance(answer, FakeResponse) else FakeResponse(body=answer, kind=kind)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024  # the default backlog of 5 refuses bursts of concurrent clients
    fake: FakeLLMServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that time out and hang up are part of the tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes: with Nagle on, the body waits for the client's delayed
    # ACK of the headers (40 ms on Linux loopback), which made every faked call take ~45 ms.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._send(404, {"error": {"message": f"no route GET {self.path}", "type": "not_found"}}, {})

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        kind = ROUTES.get(path)
        if kind is None:
            self._send(404, {"error": {"message": f"no route POST {path}", "type": "not_found"}}, {})
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        if not isinstance(body, dict):
            response = FakeResponse(status=400, error_message="request body is not a JSON object")
        else:
            try:
                response = fake._answer(kind, path, headers, body, int(self.client_address[1]), raw)
            except Exception as exc:  # a bug in the fake must reach the test, not vanish in a thread
                response = FakeResponse(status=500, error_message=f"FakeLLMServer failed: {exc!r}")
        wait_s = response.delay_s + fake.latency_s
        if wait_s > 0 and fake._closing.wait(wait_s):
            self.close_connection = True
            return
        if response.disconnect:
            self.close_connection = True
            return
        out_headers = dict(response.headers)
        payload = response.body
        if payload is None:
            render = anthropic_error_body if kind == "anthropic" else openai_error_body
            payload = render(response.status, response.error_message or "error", response.error_type)
        request_id_header = "request-id" if kind == "anthropic" else "x-request-id"
        out_headers.setdefault(request_id_header, f"req_fake{next(_ids)}")
        if isinstance(body, dict) and body.get("stream") is True and response.body is not None:
            if response.status == 200:
                write_stream(self, kind, response, body, fake.stream, fake._closing, out_headers)
                return
        self._send(response.status, payload, out_headers)

    def _send(self, status: int, payload: dict[str, Any], headers: Mapping[str, str]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True  # the client gave up (timeout) before we answered


class _AsIs(BaseHTTPRequestHandler):
    """Answers every POST with a 200 and the class's body, as-is."""

    body = b""
    content_type = "text/event-stream"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", self.content_type)
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


@contextmanager
def as_is_server(body: bytes, content_type: str = "text/event-stream") -> Iterator[str]:
    """A server answering every POST with a 200 and `body` exactly (an SSE stream or a JSON body
    that no well-formed fake would send: hostile-answer tests); yields its base URL."""
    handler = type("Handler", (_AsIs,), {"body": body, "content_type": content_type})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
