"""Anthropic Messages adapter (`anthropic.AsyncAnthropic().messages.create`, streamed or not).

Translation rules the Messages API enforces (400 otherwise):
* system prompts live in the top-level `system` field, never in `messages`;
* assistant tool calls are `tool_use` blocks whose `input` is a JSON object;
* tool results are `tool_result` blocks in a *user* turn, placed before any text of that turn,
  and consecutive turns of one role are merged into one message;
* `max_tokens` is required.

anthropic >= 1.0 removed `temperature` from `create()`'s signature, so it travels in
`extra_body`. The SDK's own OpenTelemetry spans are switched off through the client's
`open_telemetry` option (they would duplicate Stevora's `chat` spans); the environment variable
`ANTHROPIC_OPEN_TELEMETRY=false` is not needed and not read for clients built here.

The SDK sends every request (its headers, retries, timeouts and error types), but the body goes as
the JSON `messages.create` would send (`wire_body`) and the answer, streamed or not, is read as
JSON here: `create` copies the whole transcript on every call and builds a pydantic model of the
answer and of every stream event, none of which the `LlmResponse` needs (docs/benchmarks.md, "The
real path, counted"). What the SDK builds the same way on every call is built once and copied:
its request options per timeout (`_request_options`, handed to `client.request` as `post` hands
them) and, on the adapter's own client, its headers per value of what they are built from
(`_AnthropicClient._build_headers`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import anthropic
import httpx2
from anthropic._models import FinalRequestOptions
from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from stevora.definitions.output_schema import native_schema
from stevora.errors import ProviderError
from stevora.llm.messages import (
    LlmRequest,
    LlmResponse,
    Message,
    NamedTool,
    Part,
    ReasoningItem,
    ToolCall,
    ToolSpec,
    Usage,
)
from stevora.llm.provider import (
    JSON_INSTRUCTION,
    MALFORMED,
    HttpStack,
    RemainingHeaders,
    checked_response,
    connection_error,
    deadline,
    error_message_from_body,
    headers_made_once,
    idempotency_key_if_sent,
    leave_429_to_the_limiter,
    made_once,
    malformed_answer,
    parse_tool_input,
    part_base64,
    provider_error_for_status,
    sdk_http_client,
    timeout_error,
    timeout_key,
    url_made_once,
)
from stevora.llm.streaming import BROKEN_STREAM, StreamAccumulator
from stevora.llm.structured import StructuredPlan, plan_structured
from stevora.llm.wire_json import ENCODER, Kept, body_json, item_json
from stevora.tools.invoke import loads_json

# What is left of the organisation's limits, on Anthropic's answers.
REMAINING_HEADERS = RemainingHeaders(
    "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-tokens-remaining"
)

# The output tokens past which a model's plain (non-streamed) call is refused by `create`; a
# private SDK name, so an SDK without it means "no model-specific limit", not a failed import.
try:
    from anthropic._constants import MODEL_NONSTREAMING_TOKENS
except ImportError:  # pragma: no cover - depends on the SDK version
    MODEL_NONSTREAMING_TOKENS = {}

# A stream that broke after its 200 (`StreamAccumulator.broken`).
_BROKEN: tuple[type[Exception], ...] = (anthropic.AnthropicError, *BROKEN_STREAM)

# Anthropic stop reasons in the provider-neutral (OpenAI) vocabulary of `LlmResponse.finish_reason`.
_FINISH_REASONS: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


class _AnthropicClient(anthropic.AsyncAnthropic):
    """The SDK's client, its `_prepare_url` (the base URL joined with a request's path: ~270
    Python calls of httpx's URL parser per request) made once per path and base URL: it depends
    on nothing else, and an `httpx2.URL` is immutable; its `_build_headers` made once per value
    of what it reads. Its `_idempotency_key` is made only when the client sends it
    (`idempotency_key_if_sent`), and `_copy_and_prepare` skips walking a body it does not have.
    All four are private SDK names: tests/unit/llm/test_sdk_private_names.py fails first if an
    SDK renames them or changes what they read. Everything else is the SDK's own."""

    def _prepare_url(self, url: str) -> httpx2.URL:
        return url_made_once(self, "_stevora_urls", self.base_url, url, super()._prepare_url)

    def _idempotency_key(self) -> str:
        return idempotency_key_if_sent(self, super()._idempotency_key)

    async def _copy_and_prepare(self, options: FinalRequestOptions) -> FinalRequestOptions:
        """The SDK's copy of the options, whose walk of the body and query (for files to read)
        finds nothing in the options the adapter sends: its body as `content` bytes, no
        `json_data`, `extra_json` or `params`. Any other goes through the SDK's own."""
        if options.json_data is None and options.extra_json is None and not options.params:
            return options.model_copy()
        return await super()._copy_and_prepare(options)

    def _build_headers(self, options: FinalRequestOptions, *, retries_taken: int = 0) -> httpx2.Headers:
        """The SDK's `_build_headers` (~190 Python calls: 15 headers set one by one into an
        `httpx2.Headers`, each re-scanning it, then checked), made once per value of everything it
        reads (`_headers_key`) and copied for each request (`headers_made_once`)."""
        return headers_made_once(
            self,
            _headers_key(self, options, retries_taken),
            lambda: super(_AnthropicClient, self)._build_headers(options, retries_taken=retries_taken),
        )


# The SDK's `User-Agent` is its client class's name (`AsyncAnthropic/Python 2.x`): this subclass
# sends the SDK's, not its own.
_AnthropicClient.__name__ = anthropic.AsyncAnthropic.__name__


def _headers_key(client: Any, options: FinalRequestOptions, retries_taken: int) -> tuple[Any, ...]:
    """Everything the SDK's `BaseClient._build_headers` and `AsyncAnthropic._validate_headers`
    read (a test pins the names they read): the timeouts, the retry count, the idempotency key
    when the client sends one, the client's default and custom headers (its credentials among
    them) in order, the request's own headers, and whether a token cache stands in for them."""
    idempotency = options.idempotency_key if client._idempotency_header else None
    extra = options.headers
    return (
        timeout_key(options.timeout, anthropic.NotGiven),
        timeout_key(client.timeout, anthropic.NotGiven),
        retries_taken,
        client._idempotency_header,
        idempotency,
        tuple(client.default_headers.items()),
        tuple(client._custom_headers.items()),
        tuple(extra.items()) if isinstance(extra, dict) else _not_given_as_one(extra),
        getattr(client, "_token_cache", None) is None,
    )


def _not_given_as_one(value: Any) -> Any:
    """`NotGiven` (a new one in each options the SDK builds, compared by identity) as one value."""
    return anthropic.NotGiven if isinstance(value, anthropic.NotGiven) else value


def _request_options(client: Any, timeout: Any, content: bytes) -> FinalRequestOptions | None:
    """The options `client.post("/v1/messages", cast_to=httpx2.Response, content=content,
    options={"timeout": timeout} or {})` gives `client.request`, without building them afresh
    (~200 Python calls: pydantic's `model_construct` resolves and deep-copies the default of each
    of 20 fields): built once per timeout by the SDK's own `FinalRequestOptions.construct`, as
    `post` builds them, and copied with this call's body (the SDK copies the options again before
    it changes any). `None` for a timeout that is not a number (`post` then builds them)."""
    if timeout is not anthropic.NOT_GIVEN and type(timeout) not in (float, int):
        return None
    given = {} if timeout is anthropic.NOT_GIVEN else {"timeout": timeout}
    template = made_once(
        client,
        "_stevora_options",
        (type(timeout), timeout),  # 30 and 30.0 are sent apart (`x-stainless-timeout`)
        lambda: FinalRequestOptions.construct(
            method="post", url="/v1/messages", json_data=None, content=b"", files=None, **given
        ),
    )
    return template.model_copy(update={"content": content})


class AnthropicProvider:
    """`Provider` backed by the Anthropic Messages API (streamed by default)."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        name: str = "anthropic",
        max_retries: int = 2,
        timeout_s: float = 60.0,
        default_max_tokens: int = 4096,
        client: anthropic.AsyncAnthropic | None = None,
        stream: bool = True,
        max_connections: int | None = None,
        http: HttpStack = "aiohttp",
    ) -> None:
        self.name = name
        self.stream = stream  # `STEVORA_LLM_STREAM`; the SDK retries a stream only before its 200
        self.default_max_tokens = default_max_tokens
        self._owns_client = client is None
        self._client = client or _AnthropicClient(
            api_key=api_key,
            base_url=base_url,
            max_retries=max_retries,
            timeout=timeout_s,
            open_telemetry=False,
            http_client=sdk_http_client(
                anthropic.DefaultAsyncHttpxClient,
                anthropic.DefaultAioHttpClient,
                [leave_429_to_the_limiter],
                max_connections,
                http,
            ),
        )

    async def complete(self, request: LlmRequest) -> LlmResponse:
        plan = self.structured_plan(request)
        kwargs = self._build_kwargs(plan)
        request = plan.request
        # The step's timeout bounds the whole call, the request's body sent included (`deadline`).
        by = deadline(request.timeout_s)
        try:
            if self.stream:
                return plan.finish(await self._complete_streamed(kwargs, request, by))
            async with asyncio.timeout_at(by):
                answer = await self._send(kwargs, stream=False)
        except TimeoutError as exc:
            raise timeout_error(self.name) from exc
        except anthropic.APIStatusError as exc:
            detail = error_message_from_body(exc.body, exc.message)
            raise provider_error_for_status(
                self.name, exc.status_code, detail, exc.response.headers, REMAINING_HEADERS
            ) from exc
        except anthropic.APITimeoutError as exc:
            raise timeout_error(self.name) from exc
        except anthropic.APIConnectionError as exc:
            raise connection_error(self.name, str(exc.__cause__ or exc)) from exc
        except anthropic.RetryableError as exc:
            raise ProviderError(f"{self.name}: {exc}", provider=self.name, retryable=True) from exc
        except anthropic.AnthropicError as exc:
            raise ProviderError(f"{self.name}: {exc}", provider=self.name, retryable=False) from exc
        try:
            message = loads_json(answer.content)
            if self._strict:
                AnthropicMessage.model_validate(message)
            response = checked_response(self.parse_message(message))
        except MALFORMED as exc:
            raise malformed_answer(self.name, "a Messages API message", exc) from exc
        return plan.finish(response)

    async def _send(self, kwargs: dict[str, Any], *, stream: bool) -> httpx2.Response:
        """POST /v1/messages through the SDK (its headers, retries, timeouts and errors), the body
        as `messages.create(**kwargs)` would write it; streamed: the answer's body still unread."""
        options: dict[str, Any] = {}
        timeout = kwargs.get("timeout", anthropic.NOT_GIVEN)
        if (
            not stream
            and timeout is anthropic.NOT_GIVEN
            and self._client.timeout == anthropic.DEFAULT_TIMEOUT
        ):
            # What `create` does for a plain call on the SDK's default timeout: one sized to max_tokens.
            timeout = _nonstreaming_timeout(self._client, kwargs)
        if timeout is not anthropic.NOT_GIVEN:
            options["timeout"] = timeout
        content = wire_body(kwargs, stream=stream)
        prepared = _request_options(self._client, timeout, content)
        if prepared is None:  # a timeout the kept options are not keyed by: `post` builds them
            answer: httpx2.Response = await self._client.post(
                "/v1/messages",
                cast_to=httpx2.Response,
                content=content,
                options=cast(Any, options),
                stream=stream,
                stream_cls=None,
            )
            return answer
        # What `post` does with the options it builds.
        answer = await self._client.request(httpx2.Response, prepared, stream=stream, stream_cls=None)
        return answer

    async def _complete_streamed(
        self, kwargs: dict[str, Any], request: LlmRequest, by: float | None
    ) -> LlmResponse:
        """One streamed call (named SSE events) folded into an `LlmResponse`; sent and read by `by`."""
        async with asyncio.timeout_at(by):
            answer = await self._send(kwargs, stream=True)
        acc = StreamAccumulator(self.name, request.sink)
        usage = _StreamUsage()
        try:
            # The step's timeout bounds the whole answer, as it does a plain one; the SDK's read
            # timeout alone would only bound the gaps between chunks.
            async with asyncio.timeout_at(by):
                async for event in stream_events(answer, strict=self._strict):
                    _fold_event(acc, usage, event)
            acc.usage = usage.total()
            response = acc.response("end_turn")
            response.finish_reason = _FINISH_REASONS.get(response.finish_reason, response.finish_reason)
            # Joined `partial_json` as the non-streamed path would have written `input`: compact JSON.
            response.tool_calls = [
                ToolCall(
                    id=c.id,
                    name=c.name,
                    arguments=json.dumps(parse_tool_input(c.arguments), separators=(",", ":")),
                )
                for c in response.tool_calls
            ]
        except TimeoutError as exc:
            raise acc.broken(f"no complete answer within {request.timeout_s:g} s") from exc
        except _BROKEN as exc:
            # `event: error` after the 200, a dropped connection, a read timeout (none of them is
            # retried by the SDK), an event that is not what the Messages API sends.
            raise acc.broken(str(exc) or type(exc).__name__) from exc
        finally:
            await answer.aclose()
        return response

    @property
    def _strict(self) -> bool:
        """A client built with `_strict_response_validation` (the tests' clients) still has every
        answer checked against the SDK's models, as `create` would have."""
        return bool(getattr(self._client, "_strict_response_validation", False))

    @property
    def client(self) -> anthropic.AsyncAnthropic:
        """The SDK client (for `with_options` tweaks; closed by `aclose` only if this provider made it)."""
        return self._client

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()

    def build_kwargs(self, request: LlmRequest) -> dict[str, Any]:
        """The keyword arguments for `messages.create` (public so tests can inspect them)."""
        return self._build_kwargs(self.structured_plan(request))

    def structured_plan(self, request: LlmRequest) -> StructuredPlan:
        """`output_config.format` (the SDK's structured-output form), else the final-answer tool;
        with thinking on, `output_config.format` else the prompt: the API refuses the forced
        tool_choice the final-answer tool needs when thinking is enabled."""
        native = native_schema(request.output_schema, "anthropic") if request.output_schema else None
        thinking = request.thinking_budget_tokens is not None
        return plan_structured(
            request,
            native=native,
            tool_ok=not thinking,
            provider=self.name,
            no_tool_reason=THINKING_NO_FORCED_TOOL if thinking else None,
        )

    def _build_kwargs(self, plan: StructuredPlan) -> dict[str, Any]:
        request = plan.request
        system, messages = to_anthropic_messages(request.messages)
        note = plan.instruction or (JSON_INSTRUCTION if request.response_format == "json" else None)
        if note is not None:
            # No JSON mode in the Messages API: say it in the system prompt instead.
            system = f"{system}\n\n{note}" if system else note
        budget = request.thinking_budget_tokens
        max_tokens = request.max_tokens or self.default_max_tokens + (budget or 0)
        kwargs: dict[str, Any] = {"model": request.model, "max_tokens": max_tokens, "messages": messages}
        if budget is not None:
            # The answer's thinking blocks come back with every later round (`_blocks`).
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": budget}
        if system:
            kwargs["system"] = system
        if plan.native_schema is not None:
            kwargs["output_config"] = {"format": {"type": "json_schema", "schema": plan.native_schema}}
        if request.tools:
            kwargs["tools"] = [_tool_param(t) for t in request.tools]
            tool_choice = _tool_choice(request)
            if tool_choice is not None:
                kwargs["tool_choice"] = tool_choice
        if request.temperature is not None and budget is None:  # thinking takes no temperature
            kwargs["extra_body"] = {"temperature": request.temperature}
        if request.timeout_s is not None:
            kwargs["timeout"] = request.timeout_s
        if request.cache_key is not None:
            mark_cache_breakpoints(kwargs)
        return kwargs

    def parse_message(self, message: dict[str, Any]) -> LlmResponse:
        """A Messages API message (its JSON) as an `LlmResponse`."""
        texts: list[str] = []
        calls: list[ToolCall] = []
        reasoning: list[ReasoningItem] = []
        for block in message["content"]:
            kind = block["type"]
            if kind == "text":
                texts.append(_str(block["text"]))
            elif kind == "tool_use":
                arguments = json.dumps(block["input"], separators=(",", ":"))
                calls.append(ToolCall(id=_str(block["id"]), name=_str(block["name"]), arguments=arguments))
            elif kind == "thinking":
                reasoning.append(thinking_item(_str(block["thinking"]), _str(block["signature"])))
            elif kind == "redacted_thinking":
                reasoning.append(redacted_thinking_item(_str(block["data"])))
        stop_reason = _stop_reason(message.get("stop_reason")) or ("tool_use" if calls else "end_turn")
        return LlmResponse(
            text="".join(texts) if texts else None,
            tool_calls=calls,
            usage=_usage(message["usage"]),
            model=_str(message["model"]),
            finish_reason=_FINISH_REASONS.get(stop_reason, stop_reason),
            response_id=_str(message["id"]),
            provider=self.name,
            reasoning=reasoning,
        )


# The body keys in the order `messages.create` writes them (its typed arguments); `extra_body` follows.
_BODY_KEYS = (
    "max_tokens",
    "messages",
    "model",
    "cache_control",
    "container",
    "diagnostics",
    "inference_geo",
    "metadata",
    "output_config",
    "service_tier",
    "speed",
    "stop_sequences",
    "stream",
    "system",
    "thinking",
    "tool_choice",
    "tools",
)
# The JSON of a turn's opening, written once.
_TURN_OPENINGS = {role: f'{{"role":"{role}","content":[' for role in ("user", "assistant")}
# `create`'s arguments that are request options, not body.
_REQUEST_OPTIONS = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})


def _nonstreaming_timeout(client: anthropic.AsyncAnthropic, kwargs: dict[str, Any]) -> Any:
    """The timeout `create` gives a plain call on the SDK's default timeout, sized to `max_tokens`
    (and its `ValueError` for a call that must stream); both are the SDK's private helpers, so an
    SDK without them leaves the client's timeout (`NOT_GIVEN`)."""
    calculate = getattr(client, "_calculate_nonstreaming_timeout", None)
    if calculate is None:
        return anthropic.NOT_GIVEN
    return calculate(kwargs["max_tokens"], MODEL_NONSTREAMING_TOKENS.get(kwargs["model"]))


def wire_body(kwargs: dict[str, Any], *, stream: bool = False) -> bytes:
    """The JSON body `messages.create(**kwargs, stream=stream)` sends, byte for byte, without
    `create`'s copy of the whole body on every call (~1,000 Python calls for a 20-message
    transcript): the adapter's dicts are plain JSON values already. The transcript's blocks
    are not encoded again on every call: a block kept on its message (`wire_json.Kept`) is
    encoded once and its JSON joined in (a tool loop's earlier turns are the same blocks round
    after round)."""
    if stream:
        kwargs = {**kwargs, "stream": True}
    body = {key: kwargs[key] for key in _BODY_KEYS if key in kwargs}
    for key, value in kwargs.items():
        if key not in _REQUEST_OPTIONS and key not in body:
            body[key] = value
    body.update(kwargs.get("extra_body") or {})
    return body_json(body, "messages", _turns_json)


def _turns_json(turns: list[Any]) -> str:
    """`ENCODER.encode(turns)`, each kept block's JSON encoded once (`wire_json.Kept`)."""
    out = []
    for turn in turns:
        # A turn as `to_anthropic_messages` makes it: {"role": ..., "content": [...]}, in that order.
        role = turn.get("role") if type(turn) is dict and len(turn) == 2 else None
        opening = _TURN_OPENINGS.get(role) if type(role) is str else None
        content = turn.get("content") if opening is not None else None
        if opening is None or type(content) is not list or next(iter(turn)) != "role":
            out.append(ENCODER.encode(turn))
            continue
        blocks = [
            block.json if type(block) is Kept and block.json is not None else item_json(block)
            for block in content
        ]
        out.append(opening + ",".join(blocks) + "]}")
    return "[" + ",".join(out) + "]"


# `type(...) is`, not `isinstance`: a JSON value is never a subclass, and this runs per event.
def _str(value: Any) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _stop_reason(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"stop_reason is {type(value).__name__}, not a string")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:  # a bool is not a count
        raise TypeError(f"expected a token count, got {value!r}")
    return value


THINKING_NO_FORCED_TOOL = (
    "thinking is on, and Anthropic takes no forced tool_choice with thinking, so the final-answer "
    "tool cannot be used: the schema is said in the prompt"
)


def thinking_item(thinking: str, signature: str) -> ReasoningItem:
    """A `thinking` block as it goes back to the API: the text and signature exactly as received."""
    return ReasoningItem.of("anthropic", {"type": "thinking", "thinking": thinking, "signature": signature})


def redacted_thinking_item(data: str) -> ReasoningItem:
    return ReasoningItem.of("anthropic", {"type": "redacted_thinking", "data": data})


def to_anthropic_messages(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """Split out the system prompt and build Messages-API turns (merged, tool results first)."""
    system_parts: list[str] = []
    out: list[dict[str, Any]] = []
    role: str | None = None  # the last turn's role and blocks
    blocks: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            if message.content:
                system_parts.append(message.content)
            continue
        # Made once per message (`Message.wire_form`); an attachment's base64 is not kept.
        kind, made = _blocks(message) if message.parts else message.wire_form("anthropic", _kept_blocks)
        if not made:
            continue
        if kind == role:
            blocks.extend(made)
        else:
            role, blocks = kind, list(made)  # a copy: the turn's list grows and is marked
            out.append({"role": kind, "content": blocks})
    for turn in out:
        turn_blocks = turn["content"]
        if len(turn_blocks) > 1 and turn["role"] == "user":
            results = [b for b in turn_blocks if b["type"] == "tool_result"]
            turn["content"] = results + [b for b in turn_blocks if b["type"] != "tool_result"]
    return ("\n\n".join(system_parts) or None), out


def _kept_blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    """`_blocks(message)` as kept on the message: each block `Kept`, encoded once."""
    kind, made = _blocks(message)
    return kind, [Kept(block) for block in made]


def _part_block(part: Part) -> dict[str, Any]:
    """One content block in the Messages API's words: `image` (base64 or url) or `document`."""
    if part.type == "text":
        return {"type": "text", "text": part.text or ""}
    if part.url is not None:
        return {"type": "image", "source": {"type": "url", "url": part.url}}
    source = {"type": "base64", "media_type": part.media_type, "data": part_base64(part)}
    return {"type": "image" if part.type == "image" else "document", "source": source}


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    if message.role == "tool":
        content: str | list[dict[str, Any]] = message.content or ""
        if message.attachments:  # the tool's images and files travel inside its result
            content = [{"type": "text", "text": message.content or "(attachments)"}]
            content += [_part_block(part) for part in message.attachments]
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
            "content": content,
        }
        if message.is_error:
            block["is_error"] = True
        return "user", [block]
    # Thinking first, as the API wrote the turn: with thinking on, the API refuses an assistant
    # tool-use turn that does not start with its thinking blocks, signatures unchanged.
    blocks = [block for r in message.reasoning if r.kind == "anthropic" and (block := r.item())]
    if message.parts and message.role == "user":
        # The API rejects empty text blocks.
        blocks += [_part_block(p) for p in message.parts if p.type != "text" or p.text]
    elif message.content:  # the API rejects empty text blocks
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": parse_tool_input(call.arguments)}
        )
    return message.role, blocks


# Anthropic takes at most this many `cache_control` breakpoints in one request (400 beyond).
MAX_CACHE_BREAKPOINTS = 4
_EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}


def mark_cache_breakpoints(kwargs: dict[str, Any]) -> None:
    """Place prompt-cache breakpoints so each round reads the rounds before it from the cache.

    At most four, in prompt order: the last tool (tools head the prompt), the system prompt, the
    end of the previous round (exactly where the previous request wrote its cache, so the read
    does not depend on the API's 20-block lookback, which a round of many parallel calls would
    exceed) and the end of this request (written for the next round). The markers are the only
    bytes that move from round to round: the prefix before them is the same request after request.
    """
    tools = kwargs.get("tools")
    if tools:
        tools[-1] = {**tools[-1], "cache_control": _EPHEMERAL}
    system = kwargs.get("system")
    if system:
        kwargs["system"] = [{"type": "text", "text": system, "cache_control": _EPHEMERAL}]
    messages: list[dict[str, Any]] = kwargs["messages"]
    marked = [len(messages) - 1] if messages else []
    # The previous request ended with the user turn that precedes this request's last assistant turn.
    last_assistant = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "assistant"), None
    )
    if last_assistant is not None and last_assistant > 0 and messages[last_assistant - 1]["role"] == "user":
        marked.insert(0, last_assistant - 1)
    for index in marked:
        blocks = messages[index]["content"]
        blocks[-1] = {**blocks[-1], "cache_control": _EPHEMERAL}


def _tool_choice(request: LlmRequest) -> dict[str, Any] | None:
    """`tool_choice` in the Messages API's words; `None` when the default (auto, parallel) applies."""
    choice = request.tool_choice
    if isinstance(choice, NamedTool):
        out: dict[str, Any] = {"type": "tool", "name": choice.name}
    elif choice == "none":
        return {"type": "none"}  # parallelism means nothing when no tool may be called
    elif choice == "required":
        out = {"type": "any"}
    elif request.parallel_tool_calls:
        return None
    else:
        out = {"type": "auto"}
    if not request.parallel_tool_calls:
        out["disable_parallel_tool_use"] = True
    return out


def _tool_param(tool: ToolSpec) -> dict[str, Any]:
    schema = tool.parameters or {"type": "object", "properties": {}}
    return {"name": tool.name, "description": tool.description, "input_schema": schema}


def _usage(usage: dict[str, Any]) -> Usage:
    cache_read = _int(usage.get("cache_read_input_tokens") or 0)
    cache_write = _int(usage.get("cache_creation_input_tokens") or 0)
    details = usage.get("output_tokens_details")
    return Usage(
        # Anthropic's input_tokens excludes cached tokens; ours counts every prompt token.
        input_tokens=_int(usage["input_tokens"]) + cache_read + cache_write,
        output_tokens=_int(usage["output_tokens"]),
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        reasoning_tokens=_int(details.get("thinking_tokens") or 0) if details else 0,
    )


class _StreamUsage:
    """Usage over a stream: `message_start` has the prompt side; `message_delta` counts are cumulative."""

    def __init__(self) -> None:
        self.input = self.output = self.cache_read = self.cache_write = self.thinking = 0

    def update(self, usage: dict[str, Any] | None) -> None:
        if usage is None:
            return
        get = usage.get
        if (value := get("input_tokens")) is not None:
            self.input = _int(value)
        if (value := get("output_tokens")) is not None:
            self.output = _int(value)
        if (value := get("cache_read_input_tokens")) is not None:
            self.cache_read = _int(value)
        if (value := get("cache_creation_input_tokens")) is not None:
            self.cache_write = _int(value)
        details = get("output_tokens_details")
        if details is not None:
            self.thinking = _int(details.get("thinking_tokens") or 0)

    def total(self) -> Usage:
        return Usage(
            input_tokens=self.input + self.cache_read + self.cache_write,
            output_tokens=self.output,
            cache_read_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
            reasoning_tokens=self.thinking,
        )


_STREAM_EVENT: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


async def stream_events(answer: httpx2.Response, *, strict: bool = False) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a Messages API event stream, as the SDK's stream reads them: lines
    split on CR, LF or CRLF in the body's bytes and each event's data read as UTF-8 (what the
    SDK's `SSEDecoder` does, rather than httpx's text lines, which would also split a JSON string
    at U+2028), `ping` and unnamed events skipped, `event: error` raised as the SDK raises it (an
    `APIStatusError` with the answer's status), the body read to its end (so the connection is
    reused)."""
    name: bytes | None = None
    data: list[bytes] = []
    async for lines in _sse_lines(answer):
        for line in lines:
            if line:
                field, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if field == b"event":
                    name = value
                elif field == b"data":
                    data.append(value)
                continue  # `id:`, `retry:` and `:` comments: nothing the Messages API uses
            event, raw, name = name, data[0] if len(data) == 1 else b"\n".join(data), None
            data.clear()
            if event is None or event == b"ping":
                continue
            if event == b"error":
                text = raw.decode("utf-8", "replace")
                try:
                    body: object = json.loads(text)
                    message = f"{body}"
                except ValueError:
                    body, message = text, text or f"Error code: {answer.status_code}"
                raise anthropic.APIStatusError(message, response=answer, body=body)
            if not raw:
                continue
            # ASCII bytes read as their text does, without decoding and encoding them again.
            parsed = loads_json(raw if raw.isascii() else raw.decode("utf-8", "replace"))
            if not isinstance(parsed, dict):
                raise ValueError(f"a stream event is not a JSON object: {raw[:100]!r}")
            if strict:
                _STREAM_EVENT.validate_python(parsed)
            yield parsed


async def _sse_lines(answer: httpx2.Response) -> AsyncIterator[list[bytes]]:
    """The body's lines, without their ends, a chunk's worth at a time (one list per chunk: a
    line per Python call would cost as much as httpx's line decoder). A line is yielded once its
    end has arrived; a CR at a chunk's end waits for the next chunk, which may hold its LF. The
    unfinished line's pieces are joined once, when a chunk with a line end arrives: a long line
    (a hostile stream's) costs linear time, not a copy of all of it per chunk."""
    pending: list[bytes] = []
    # Without a content encoding the raw bytes are the body: httpx's decoded iterator would only
    # pass each chunk through its identity decoder and chunker (~4 Python calls a chunk). A body
    # already read (a transport or hook that read it) is only there.
    raw = "content-encoding" not in answer.headers and not answer.is_stream_consumed
    chunks = answer.aiter_raw() if raw else answer.aiter_bytes()
    async for chunk in chunks:
        if b"\n" not in chunk and b"\r" not in chunk:
            pending.append(chunk)
            continue
        pending.append(chunk)
        text = b"".join(pending)
        lines = text.splitlines()  # at CR, LF and CRLF, ends dropped (no strip per line)
        end = text[-1:]
        if end == b"\n":
            pending = []
        elif end == b"\r":  # complete, unless the next chunk starts with its LF
            pending = [lines.pop() + b"\r"]
        else:
            pending = [lines.pop()]
        if lines:
            yield lines
    if pending:
        yield [b"".join(pending).rstrip(b"\r\n")]


def _fold_event(acc: StreamAccumulator, usage: _StreamUsage, event: dict[str, Any]) -> None:
    kind = event.get("type")
    if kind == "message_start":
        message = event["message"]
        acc.model, acc.response_id = _str(message["model"]), _str(message["id"])
        usage.update(message["usage"])
    elif kind == "content_block_start":
        block, index = event["content_block"], _int(event["index"])
        block_type = block["type"]
        if block_type == "text":
            acc.text(_str(block["text"]))
        elif block_type == "tool_use":
            acc.tool_start(index, _str(block["id"]), _str(block["name"]))
        elif block_type == "thinking":
            acc.reasoning_start(
                index,
                "anthropic",
                {
                    "type": "thinking",
                    "thinking": _str(block["thinking"]),
                    "signature": _str(block["signature"]),
                },
            )
        elif block_type == "redacted_thinking":
            acc.reasoning_start(
                index, "anthropic", {"type": "redacted_thinking", "data": _str(block["data"])}
            )
    elif kind == "content_block_delta":
        delta, index = event["delta"], _int(event["index"])
        delta_type = delta["type"]
        if delta_type == "text_delta":
            acc.text(_str(delta["text"]))
        elif delta_type == "input_json_delta":
            acc.tool_arguments(index, _str(delta["partial_json"]))
        elif delta_type == "thinking_delta":
            acc.reasoning_append(index, "thinking", _str(delta["thinking"]))
        elif delta_type == "signature_delta":
            acc.reasoning_append(index, "signature", _str(delta["signature"]))
    elif kind == "message_delta":
        acc.finish_reason = _stop_reason(event["delta"].get("stop_reason")) or acc.finish_reason
        usage.update(event.get("usage"))
    elif kind == "message_stop":
        acc.finished = True
