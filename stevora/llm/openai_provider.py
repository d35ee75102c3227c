"""OpenAI Chat Completions adapter; also the adapter for OpenAI-compatible servers.

Ollama, vLLM, llama.cpp and OpenRouter speak the same `/v1/chat/completions` dialect: give a
`base_url` and a distinct `name` (the name is what routing, traces and pricing see). What differs
between servers is data, not code: a `ServerCapabilities` per provider (docs/providers.md).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import httpx2
import openai
import structlog
from openai import NotGiven, Omit
from openai._models import FinalRequestOptions
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion

from stevora.definitions.output_schema import native_schema
from stevora.errors import ProviderError
from stevora.llm import openai_responses
from stevora.llm.capabilities import ServerCapabilities
from stevora.llm.messages import (
    LlmRequest,
    LlmResponse,
    Message,
    NamedTool,
    OpenAIApi,
    Part,
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
    data_url,
    deadline,
    error_message_from_body,
    headers_made_once,
    idempotency_key_if_sent,
    is_invalid_request_answer,
    leave_429_to_the_limiter,
    malformed_answer,
    mentions_json,
    provider_error_for_status,
    sdk_http_client,
    timeout_error,
    timeout_key,
    url_made_once,
)
from stevora.llm.streaming import BROKEN_STREAM, StreamAccumulator
from stevora.llm.structured import STRUCTURED_NAME, StructuredPlan, plan_structured
from stevora.llm.wire_json import Kept
from stevora.tools.invoke import loads_json

MaxTokensField = Literal["max_tokens", "max_completion_tokens"]

# OpenAI's own API: every documented form.
OPENAI_CAPABILITIES = ServerCapabilities(
    tool_choice=frozenset({"required", "none", "named"}),
    tool_call_content="null",
    parallel_tool_calls=True,
    usage=True,
    stream_usage=True,
    prompt_cache_key=True,
    json_schema=True,
)

# A stream that broke after its 200 (`StreamAccumulator.broken`).
_BROKEN: tuple[type[Exception], ...] = (openai.OpenAIError, *BROKEN_STREAM)

# What is left of the organisation's limits, on OpenAI's answers (compatible servers that send
# limits use the same names).
REMAINING_HEADERS = RemainingHeaders("x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens")

log = structlog.get_logger("stevora.llm")


async def mark_invalid_request_answer(response: httpx2.Response) -> None:
    """httpx response hook: a 5xx whose body says the request is invalid gets `x-should-retry: false`.

    The SDK obeys that header, so it does not resend a doomed request, and the adapter translates
    the answer as non-retryable, so the step does not spend its retry budget on it either.
    """
    if response.status_code < 500 or "x-should-retry" in response.headers:
        return
    await response.aread()
    try:
        body: object = json.loads(response.content or b"null")
    except ValueError:
        body = response.text
    if is_invalid_request_answer(response.status_code, body):
        response.headers["x-should-retry"] = "false"


def http_client(max_connections: int | None = None, http: HttpStack = "aiohttp") -> httpx2.AsyncClient:
    """The SDK's HTTP client (`sdk_http_client`: aiohttp by default) with
    `mark_invalid_request_answer` and `leave_429_to_the_limiter` installed; `max_connections` (in
    flight, and as many kept alive for the next call) replaces the SDK's 1,000 / 100 kept alive."""
    return sdk_http_client(
        openai.DefaultAsyncHttpxClient,
        openai.DefaultAioHttpClient,
        [mark_invalid_request_answer, leave_429_to_the_limiter],
        max_connections,
        http,
    )


class _OpenAIClient(openai.AsyncOpenAI):
    """The SDK's client, its `_prepare_url` (the base URL joined with a request's path: ~300
    Python calls of httpx's URL parser per request) made once per path and base URL: it depends
    on nothing else, and an `httpx2.URL` is immutable; its `_build_headers` made once per value
    of what it reads, as Anthropic's (`_AnthropicClient`); its `_idempotency_key` made only when
    the client sends it (`idempotency_key_if_sent`). All three are private SDK names:
    tests/unit/llm/test_sdk_private_names.py fails first if an SDK renames them or changes what
    they read. Everything else is the SDK's own."""

    def _prepare_url(self, url: str) -> httpx2.URL:
        return url_made_once(self, "_stevora_urls", self.base_url, url, super()._prepare_url)

    def _idempotency_key(self) -> str:
        return idempotency_key_if_sent(self, super()._idempotency_key)

    def _build_headers(self, options: FinalRequestOptions, *, retries_taken: int = 0) -> httpx2.Headers:
        """The SDK's `_build_headers` (~190 Python calls: 13 headers normalised into an
        `httpx2.Headers`, some set one by one, each re-scanning it), made once per value of
        everything it reads (`_headers_key`) and copied for each request (`headers_made_once`)."""
        return headers_made_once(
            self,
            _headers_key(self, options, retries_taken),
            lambda: super(_OpenAIClient, self)._build_headers(options, retries_taken=retries_taken),
        )


# The SDK's `User-Agent` is its client class's name (`AsyncOpenAI/Python 1.x`): this subclass
# sends the SDK's, not its own.
_OpenAIClient.__name__ = openai.AsyncOpenAI.__name__


def _headers_key(client: Any, options: FinalRequestOptions, retries_taken: int) -> tuple[Any, ...]:
    """Everything the SDK's `BaseClient._build_headers` and `AsyncOpenAI`'s `_auth_headers` and
    `_validate_headers` read (a test pins the names they read): the timeouts, the retry count, the
    idempotency key when the client sends one, the credentials the request's security asks for
    (the current API key: a key an API-key provider refreshed arrives in the request's own
    headers), the client's default and custom headers in order, the request's own headers, and
    whether a provider (e.g. Azure) stands in for the credentials' check."""
    idempotency = options.idempotency_key if client._idempotency_header else None
    return (
        timeout_key(options.timeout, NotGiven),
        timeout_key(client.timeout, NotGiven),
        retries_taken,
        client._idempotency_header,
        idempotency,
        _headers_items(client._auth_headers(options.security)),
        _headers_items(client.default_headers),
        _headers_items(options.headers),
        getattr(client, "_provider_runtime", None) is None,
    )


def _headers_items(headers: Any) -> Any:
    """Headers as a key, in order: an `Omit` (a new one on every call, which compares by
    identity) as its type, and no request headers (`NotGiven`) as one value. A list, not a
    generator: this runs for every request, and each step of a generator is a Python call."""
    if isinstance(headers, dict):
        return tuple(
            [
                (name, value if type(value) is str or not isinstance(value, Omit) else type(value))
                for name, value in headers.items()
            ]
        )
    return NotGiven if isinstance(headers, NotGiven) else headers


class OpenAIProvider:
    """`Provider` backed by `openai.AsyncOpenAI().chat.completions.create` (streamed by default)."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        name: str = "openai",
        max_retries: int = 2,
        timeout_s: float = 60.0,
        client: openai.AsyncOpenAI | None = None,
        max_tokens_field: MaxTokensField | None = None,
        capabilities: ServerCapabilities | None = None,
        stream: bool = True,
        default_api: OpenAIApi = "chat",
        max_connections: int | None = None,
        http: HttpStack = "aiohttp",
    ) -> None:
        self.name = name
        self.stream = stream  # `STEVORA_LLM_STREAM`; the SDK retries a stream only before its 200
        # The provider setting (docs/configuration.md): the API of a request whose step does not say (`api`).
        self.default_api: OpenAIApi = default_api
        self.capabilities = capabilities or (
            OPENAI_CAPABILITIES if name == "openai" else ServerCapabilities()
        )
        self._owns_client = client is None
        self._client = client or _OpenAIClient(
            api_key=api_key,
            base_url=base_url,
            max_retries=max_retries,
            timeout=timeout_s,
            http_client=http_client(max_connections, http),
        )
        self._usage_warned = False
        # OpenAI's reasoning models reject `max_tokens`; many compatible servers only know it.
        self._max_tokens_field: MaxTokensField = max_tokens_field or (
            "max_completion_tokens" if name == "openai" else "max_tokens"
        )

    async def complete(self, request: LlmRequest) -> LlmResponse:
        responses = (request.api or self.default_api) == "responses"
        plan = self.structured_plan(request)  # the same forms on both APIs, in their own words
        kwargs = openai_responses.build_kwargs(request, plan) if responses else self._build_kwargs(plan)
        request = plan.request
        # The step's timeout bounds the whole call, the request's body sent included (`deadline`).
        by = deadline(request.timeout_s)
        try:
            if responses:  # the Responses API (stevora/llm/openai_responses.py): usage always sent
                response, usage_sent = (
                    await openai_responses.complete(
                        self._client,
                        self.name,
                        kwargs,
                        request,
                        stream=self.stream,
                        by=by,
                    ),
                    True,
                )
            elif self.streams:
                response, usage_sent = await self._complete_streamed(kwargs, request, by)
            else:
                # Sent through the SDK without `create`, the answer read as JSON (`post`).
                async with asyncio.timeout_at(by):
                    raw = await openai_responses.post(self._client, "/chat/completions", kwargs, stream=False)
                response, usage_sent = self.read_completion(raw.content)
        except TimeoutError as exc:
            raise timeout_error(self.name) from exc
        except openai.APIStatusError as exc:
            message = error_message_from_body(exc.body, exc.message)
            raise provider_error_for_status(
                self.name, exc.status_code, message, exc.response.headers, REMAINING_HEADERS
            ) from exc
        except openai.APITimeoutError as exc:
            raise timeout_error(self.name) from exc
        except openai.APIConnectionError as exc:
            raise connection_error(self.name, str(exc.__cause__ or exc)) from exc
        except openai.OpenAIError as exc:
            # Response validation, missing credentials and other client-side failures: a retry
            # would fail the same way.
            raise ProviderError(f"{self.name}: {exc}", provider=self.name, retryable=False) from exc
        if not usage_sent and self.capabilities.usage and not self._usage_warned:
            self._usage_warned = True  # once per provider: tokens and cost of its calls read as 0
            setting = "stream_usage" if self.streams else "usage"
            log.warning(
                "llm_usage_missing",
                provider=self.name,
                hint=f"set {setting}: false in STEVORA_COMPAT_CAPABILITIES if this server never sends it",
            )
        return plan.finish(response)

    async def _complete_streamed(
        self, kwargs: dict[str, Any], request: LlmRequest, by: float | None
    ) -> tuple[LlmResponse, bool]:
        """One streamed call folded into an `LlmResponse`, sent and read by `by`; (response,
        whether usage arrived)."""
        if self.capabilities.stream_usage:  # servers that do not know the option may reject it
            kwargs = {**kwargs, "stream_options": {"include_usage": True}}
        # The SDK sends the request and retries it until the 200 as for `create(stream=True)`
        # (`post`); the chunks are read as JSON here: the SDK's stream builds a pydantic model of
        # every chunk (about a quarter of a streamed call's CPU) for the few fields read below.
        async with asyncio.timeout_at(by):
            raw = await openai_responses.post(self._client, "/chat/completions", kwargs, stream=True)
        acc = StreamAccumulator(self.name, request.sink)
        usage_sent = False
        try:
            # The step's timeout bounds the whole answer, as it does a plain one; the SDK's
            # read timeout alone would only bound the gaps between chunks.
            async with asyncio.timeout_at(by):
                async for chunk in openai_responses.sse_chunks(raw):
                    acc.model = chunk.get("model") or acc.model
                    acc.response_id = chunk.get("id") or acc.response_id
                    if chunk.get("usage") is not None:
                        usage = CompletionUsage.model_validate(chunk["usage"])
                        acc.usage, usage_sent = _usage_of(usage), True
                    for choice in (chunk.get("choices") or ())[:1]:
                        _fold_delta(acc, choice.get("delta") or {})
                        if choice.get("finish_reason") is not None:
                            acc.finish_reason, acc.finished = str(choice["finish_reason"]), True
            response = acc.response("stop")
        except TimeoutError as exc:
            raise acc.broken(f"no complete answer within {request.timeout_s:g} s") from exc
        except _BROKEN as exc:
            # `data: {"error": ...}` after the 200, a dropped connection, a read timeout, a
            # chunk that is not a JSON object, an answer of other types.
            raise acc.broken(str(exc) or type(exc).__name__) from exc
        finally:
            await raw.aclose()
        return response, usage_sent

    @property
    def streams(self) -> bool:
        """Whether calls stream: on by setting, unless a stream would lose the usage (and so the
        cost) that this server's plain answers carry: it must take `stream_options.include_usage`."""
        return self.stream and (self.capabilities.stream_usage or not self.capabilities.usage)

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The SDK client (for `with_options` tweaks; closed by `aclose` only if this provider made it)."""
        return self._client

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()

    def build_kwargs(self, request: LlmRequest) -> dict[str, Any]:
        """The keyword arguments for `chat.completions.create` (public so tests can inspect them)."""
        return self._build_kwargs(self.structured_plan(request))

    def structured_plan(self, request: LlmRequest) -> StructuredPlan:
        """How this server is held to the request's `output_schema` (docs/providers.md,
        "Structured outputs"): strict `json_schema`, else the final-answer tool, else the prompt."""
        caps = self.capabilities
        # The final-answer tool must be forced: by name alone, or by `required` beside other tools.
        tool_ok = "named" in caps.tool_choice and (not request.tools or "required" in caps.tool_choice)
        return plan_structured(
            request,
            native=native_schema(request.output_schema, "openai")
            if caps.json_schema and request.output_schema
            else None,
            tool_ok=tool_ok,
            provider=self.name,
        )

    def _build_kwargs(self, plan: StructuredPlan) -> dict[str, Any]:
        request = plan.request
        caps = self.capabilities
        messages = _messages_param(request.messages, caps.tool_call_content)
        kwargs: dict[str, Any] = {"model": request.model, "messages": messages}
        if plan.native_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": STRUCTURED_NAME, "schema": plan.native_schema, "strict": True},
            }
        elif plan.instruction is not None:
            messages.insert(0, {"role": "system", "content": plan.instruction})
            if request.response_format == "json":
                kwargs["response_format"] = {"type": "json_object"}
        elif request.response_format == "json":
            kwargs["response_format"] = {"type": "json_object"}
            if not mentions_json(request.messages):
                messages.insert(0, {"role": "system", "content": JSON_INSTRUCTION})
        tool_choice = self._tool_choice(request) if request.tools else None
        if tool_choice is not None:
            kwargs["tools"] = [_tool_param(t) for t in request.tools]
            if caps.parallel_tool_calls:
                kwargs["parallel_tool_calls"] = request.parallel_tool_calls
            if tool_choice != "auto" or caps.send_auto:
                kwargs["tool_choice"] = tool_choice
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.max_tokens is not None:
            kwargs[self._max_tokens_field] = request.max_tokens
        if request.reasoning_effort is not None:  # the step's `reasoning.effort` (reasoning models)
            kwargs["reasoning_effort"] = request.reasoning_effort
        if request.timeout_s is not None:
            kwargs["timeout"] = request.timeout_s
        if request.cache_key is not None and caps.prompt_cache_key:
            kwargs["prompt_cache_key"] = request.cache_key
        return kwargs

    def _tool_choice(self, request: LlmRequest) -> str | dict[str, Any] | None:
        """The wire `tool_choice` within what this server takes; `None`: offer no tools at all.

        Fallbacks (docs/providers.md): `required` with one tool is sent as that tool's named form,
        and `none` as a request without tools. Anything else unsupported fails before the request.
        """
        choice = request.tool_choice
        supported = self.capabilities.tool_choice
        if isinstance(choice, NamedTool):
            if "named" in supported:
                return {"type": "function", "function": {"name": choice.name}}
        elif choice == "auto" or choice in supported:
            return choice
        elif choice == "required" and len(request.tools) == 1 and "named" in supported:
            # With one tool, "must call a tool" and "must call this tool" mean the same.
            return {"type": "function", "function": {"name": request.tools[0].name}}
        elif choice == "none":
            return None  # the model cannot call a tool it is not offered
        wanted = f"{{'name': '{choice.name}'}}" if isinstance(choice, NamedTool) else f"'{choice}'"
        raise ProviderError(
            f"{self.name} does not accept toolChoice {wanted} (it takes: {', '.join(['auto', *sorted(supported)])}); "
            "change the step's toolChoice or the server's tool_choice in STEVORA_COMPAT_CAPABILITIES",
            provider=self.name,
            retryable=False,
            code="TOOL_CHOICE_UNSUPPORTED",
        )

    def read_completion(self, body: bytes) -> tuple[LlmResponse, bool]:
        """A plain answer's JSON body as an `LlmResponse` and whether it carried usage; one that
        is not a Chat Completions answer (any JSON, any types) is a retryable `ProviderError`.
        A client built with `_strict_response_validation` (the tests') also has it checked
        against the SDK's `ChatCompletion`, as `create` would have."""
        try:
            completion = loads_json(body)
            if not isinstance(completion, dict):
                raise TypeError(f"the answer is {type(completion).__name__}, not an object")
            if getattr(self._client, "_strict_response_validation", False):
                ChatCompletion.model_validate(completion)
            return checked_response(self.parse_completion(completion)), completion.get("usage") is not None
        except MALFORMED as exc:
            raise malformed_answer(self.name, "a chat completion", exc) from exc

    def parse_completion(self, completion: dict[str, Any]) -> LlmResponse:
        """A Chat Completions answer (its JSON object) as an `LlmResponse`, read as the SDK's
        unvalidated `ChatCompletion` was: a field it lacks reads as `None`. Types are the
        caller's to check (`checked_response`)."""
        choices = completion.get("choices")
        if not choices:
            raise ProviderError(f"{self.name} returned no choices", provider=self.name, retryable=True)
        message = choices[0].get("message")
        calls: list[ToolCall] = []
        for call in message.get("tool_calls") or ():
            kind = call.get("type")
            if kind == "function":
                function = call.get("function")
                calls.append(ToolCall(call.get("id"), function.get("name"), function.get("arguments")))
            elif kind == "custom":  # custom (free-text) tools: the input is already the raw string
                custom = call.get("custom")
                calls.append(ToolCall(call.get("id"), custom.get("name"), custom.get("input")))
            else:
                raise TypeError(f"a tool call's type is {kind!r}")
        finish_reason = choices[0].get("finish_reason")
        model: Any = completion.get("model")  # a string, or `checked_response` says what it is
        return LlmResponse(
            text=message.get("content"),
            tool_calls=calls,
            usage=_usage_json(completion.get("usage")),
            model=model,
            finish_reason=str(finish_reason or ("tool_calls" if calls else "stop")),
            response_id=completion.get("id"),
            provider=self.name,
        )


def _tool_param(tool: ToolSpec) -> dict[str, Any]:
    parameters = tool.parameters or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": parameters},
    }


def _messages_param(messages: list[Message], tool_call_content: str) -> list[dict[str, Any]]:
    """The wire messages. Tool messages take text only, so the images and files of a round's tool
    results follow its last tool message in one user message (docs/providers.md)."""
    out: list[dict[str, Any]] = []
    held: list[Message] = []
    for message in messages:
        if message.role != "tool" and held:
            out.append(_tool_attachments_message(held))
            held = []
        out.append(_kept_message_param(message, tool_call_content))
        if message.role == "tool" and message.attachments:
            held.append(message)
    if held:
        out.append(_tool_attachments_message(held))
    return out


def _tool_attachments_message(results: list[Message]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for result in results:
        content.append({"type": "text", "text": f"Attachments returned by tool call {result.tool_call_id}:"})
        content += [_content_part(part) for part in result.attachments]
    return {"role": "user", "content": content}


def _content_part(part: Part) -> dict[str, Any]:
    """One content part in Chat Completions' words (images as data URLs, PDFs as `file`)."""
    if part.type == "text":
        return {"type": "text", "text": part.text or ""}
    if part.url is not None:
        return {"type": "image_url", "image_url": {"url": part.url}}
    url = data_url(part)
    if part.type == "image":
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "file", "file": {"filename": f"{(part.sha256 or 'file')[:16]}.pdf", "file_data": url}}


def _kept_message_param(message: Message, tool_call_content: str) -> dict[str, Any]:
    """`_message_param`, made once per message and empty-content form and kept on the message
    (`Message.wire_form`) as `Kept`: its JSON is encoded once too (`wire_json.body_json`). A
    message with parts is made afresh (an attachment's base64 is not kept)."""
    if message.parts:
        return _message_param(message, tool_call_content)
    made: dict[str, Any] = message.wire_form(
        _CHAT_FORMS[tool_call_content], lambda m: Kept(_message_param(m, tool_call_content))
    )
    return made


# `Message.wire_form`'s key for each empty-content form of a tool-calling turn.
_CHAT_FORMS = {form: f"openai-chat:{form}" for form in ("null", "empty", "omit")}


def _message_param(message: Message, tool_call_content: str = "null") -> dict[str, Any]:
    if message.parts and message.role in ("user", "system"):
        return {"role": message.role, "content": [_content_part(p) for p in message.parts]}
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content or ""}
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in message.tool_calls
            ]
            if not message.content:
                # OpenAI documents `null`; llama.cpp's server answers 500 to `null` and to a missing
                # key and takes only `""` (docs/providers.md, "The empty-content form"), so the form
                # is the server's capability.
                if tool_call_content == "omit":
                    del out["content"]
                else:
                    out["content"] = "" if tool_call_content == "empty" else None
        elif message.content is None:
            out["content"] = ""
        return out
    return {"role": message.role, "content": message.content or ""}


def _fold_delta(acc: StreamAccumulator, delta: dict[str, Any]) -> None:
    """One chunk's delta: text, and tool-call fragments keyed by `index` (the first names the call)."""
    acc.text(delta.get("content"))
    for fragment in delta.get("tool_calls") or ():
        function = fragment.get("function")
        if fragment.get("id") or (function is not None and function.get("name")):
            acc.tool_start(fragment["index"], fragment.get("id"), function.get("name") if function else None)
        if function is not None:
            acc.tool_arguments(fragment["index"], function.get("arguments"))


def _usage_json(usage: Any) -> Usage:
    """`_usage_of` for the answer's JSON `usage` (read as the SDK's unvalidated model was)."""
    if usage is None:  # some compatible servers omit it
        return Usage()
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    return Usage(
        input_tokens=usage.get("prompt_tokens"),
        output_tokens=usage.get("completion_tokens"),
        cache_read_tokens=(prompt_details.get("cached_tokens") or 0) if prompt_details else 0,
        cache_write_tokens=(prompt_details.get("cache_write_tokens") or 0) if prompt_details else 0,
        reasoning_tokens=(completion_details.get("reasoning_tokens") or 0) if completion_details else 0,
    )


def _usage_of(usage: CompletionUsage | None) -> Usage:
    if usage is None:  # some compatible servers omit it
        return Usage()
    prompt_details = usage.prompt_tokens_details
    completion_details = usage.completion_tokens_details
    return Usage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cache_read_tokens=(prompt_details.cached_tokens or 0) if prompt_details else 0,
        cache_write_tokens=(prompt_details.cache_write_tokens or 0) if prompt_details else 0,
        reasoning_tokens=(completion_details.reasoning_tokens or 0) if completion_details else 0,
    )
