"""The `Provider` protocol and the SDK-neutral half of error translation.

Adapters catch their SDK's exceptions where they enter and turn them into `ProviderError` with
`provider_error_for_status` / `connection_error` / `timeout_error`, so the engine only ever sees
one error type whose `retryable` flag drives step retries and model fallback.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import math
import re
import time
from collections.abc import Awaitable, Callable, ItemsView, Mapping
from contextlib import suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast, runtime_checkable

import httpx2
import structlog
from httpx2._utils import get_environment_proxies

from stevora.errors import ProviderError
from stevora.llm.lean_aiohttp import READ_WHOLE, lean_transport, read_whole
from stevora.llm.messages import LlmRequest, LlmResponse, Message, Part
from stevora.tools.invoke import parse_arguments

# The SDKs retry these themselves; once their retries are spent the step may retry again later.
RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 409, 429})

# Added to the prompt when JSON output is requested: Anthropic has no JSON mode, and OpenAI's
# json_object mode answers 400 unless the word "JSON" appears somewhere in the messages.
JSON_INSTRUCTION = "Respond with a single JSON object and nothing else."

# Ignore absurd server delays; the step retry policy owns long waits.
_MAX_RETRY_AFTER_S = 24 * 3600.0

# Set while a call is sent under a shared provider rate limit (stevora.engine.provider_limits):
# its 429 goes back to the limiter, which lowers the budget every worker shares and sends again
# at the next turn, instead of the SDK sending again on its own, unseen by that budget.
UNDER_SHARED_LIMIT: ContextVar[bool] = ContextVar("stevora_under_shared_limit", default=False)
_LEFT_TO_LIMITER = "x-stevora-left-to-limiter"


async def leave_429_to_the_limiter(response: httpx2.Response) -> None:
    """httpx response hook: a 429 answered to a call under a shared limit gets `x-should-retry:
    false` (both SDKs obey that header before their own retry rules), marked as ours so that
    `provider_error_for_status` still reads the 429 as retryable. A server's own `x-should-retry`
    (OpenAI's `insufficient_quota`) is left as it is; a marker the server sent itself is dropped,
    so a server cannot turn its own `x-should-retry: false` into a retry."""
    if _LEFT_TO_LIMITER in response.headers:
        del response.headers[_LEFT_TO_LIMITER]
    if response.status_code == 429 and UNDER_SHARED_LIMIT.get() and "x-should-retry" not in response.headers:
        response.headers["x-should-retry"] = "false"
        response.headers[_LEFT_TO_LIMITER] = "1"


@runtime_checkable
class Provider(Protocol):
    """One LLM backend. `complete` raises only `ProviderError` for provider failures."""

    name: str

    async def complete(self, request: LlmRequest) -> LlmResponse: ...

    async def aclose(self) -> None: ...


def is_retryable_status(status_code: int) -> bool:
    """408/409/429 and every 5xx (529 = Anthropic overloaded) are worth retrying; other 4xx are not."""
    return status_code in RETRYABLE_STATUSES or status_code >= 500


def retry_after_from_headers(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, then `retry-after` (seconds or HTTP date)."""
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and 0 <= value <= _MAX_RETRY_AFTER_S:
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        parsed = email.utils.parsedate_tz(raw)
        if parsed is None:
            return None
        value = float(email.utils.mktime_tz(parsed)) - time.time()
    if not math.isfinite(value):
        return None
    return min(max(value, 0.0), _MAX_RETRY_AFTER_S)


def error_message_from_body(body: object, fallback: str) -> str:
    """The provider's own message (`error.message` in both APIs' error bodies), else `fallback`."""
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    if isinstance(body, str) and body:
        return body
    return fallback


# A server that answers a malformed request with a 5xx still says so in the body: pydantic's
# "N validation error(s)" (llama-cpp-python turns FastAPI's request validation into a 500 with
# that message) or an OpenAI-style `invalid_request_error` type.
_VALIDATION_MESSAGE = re.compile(r"\b\d+ validation errors?\b")
_INVALID_REQUEST_TYPES: frozenset[str] = frozenset(
    {"invalid_request_error", "invalid_request", "BadRequestError", "RequestValidationError"}
)


def is_invalid_request_answer(status_code: int, body: object) -> bool:
    """A 5xx whose body says the request itself was invalid: resending it cannot succeed.

    The rule (docs/providers.md): a pydantic-style validation message, an error `type` that names
    an invalid request, or FastAPI's `detail` list of field errors located in the `body`.
    """
    if status_code < 500:
        return False
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and str(error.get("type")) in _INVALID_REQUEST_TYPES:
            return True
        detail = body.get("detail")
        if isinstance(detail, list) and any(
            isinstance(item, Mapping) and list(item.get("loc") or ())[:1] == ["body"] for item in detail
        ):
            return True
    message = error_message_from_body(body, "")
    if isinstance(body, Mapping) and isinstance(body.get("detail"), str):
        message = f"{message} {body['detail']}"
    return bool(_VALIDATION_MESSAGE.search(message))


def provider_error_for_status(
    provider: str,
    status_code: int,
    message: str,
    headers: Mapping[str, str] | None = None,
    remaining: RemainingHeaders | None = None,
) -> ProviderError:
    """Translate an HTTP error answer. `x-should-retry` from the server overrides the status rule."""
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    retryable = is_retryable_status(status_code)
    should_retry = None if _LEFT_TO_LIMITER in lowered else lowered.get("x-should-retry")
    if should_retry == "false":
        retryable = False  # e.g. OpenAI's 429 insufficient_quota: waiting will not help
    elif should_retry == "true":
        retryable = True
    too_long = context_too_long(provider, status_code, message)
    if too_long is not None:
        return too_long
    return ProviderError(
        f"{provider} returned HTTP {status_code}: {message}",
        provider=provider,
        status_code=status_code,
        retryable=retryable,
        retry_after_s=retry_after_from_headers(lowered) if retryable else None,
        remaining=remaining_from_headers(lowered, remaining) if status_code == 429 else (None, None),
    )


# How the providers word a prompt over the model's window: OpenAI "This model's maximum context
# length is 128000 tokens. However, your messages resulted in 130012 tokens." (code
# context_length_exceeded); Anthropic "prompt is too long: 208310 tokens > 200000 maximum".
_OPENAI_TOO_LONG = re.compile(r"maximum context length is (\d+) tokens.*?resulted in (\d+) tokens", re.S)
_ANTHROPIC_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
_TOO_LONG_WORDS = ("context_length_exceeded", "context length", "prompt is too long", "context window")


def context_too_long(provider: str, status_code: int, message: str) -> ProviderError | None:
    """A 400 (or 413) saying the prompt does not fit the model's window, as `CONTEXT_TOO_LONG`
    naming the tokens when the answer says them; `None` for any other answer."""
    if status_code not in (400, 413) or not any(word in message.lower() for word in _TOO_LONG_WORDS):
        return None
    tokens = limit = None
    found = _OPENAI_TOO_LONG.search(message)
    if found is not None:
        limit, tokens = int(found.group(1)), int(found.group(2))
    else:
        found = _ANTHROPIC_TOO_LONG.search(message)
        if found is not None:
            tokens, limit = int(found.group(1)), int(found.group(2))
    said = (
        f"{tokens} tokens, over the model's {limit}"
        if tokens is not None
        else "more tokens than the model takes"
    )
    error = ProviderError(
        f"{provider}: the conversation is {said}; give the step a `context` strategy "
        f"(trim_tool_results or compact, docs/long-horizon.md) or fewer rounds ({message})",
        provider=provider,
        status_code=status_code,
        retryable=False,
        code="CONTEXT_TOO_LONG",
    )
    error.details.update(inputTokens=tokens, maxInputTokens=limit)
    return error


# What OpenAI (`x-ratelimit-remaining-*`) and Anthropic (`anthropic-ratelimit-*-remaining`) say is
# left of the organisation's requests and tokens; a 429 lowers the shared budget to it.
_REMAINING_HEADERS = (
    ("x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"),
    ("x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining"),
)


@dataclass(frozen=True, slots=True)
class RemainingHeaders:
    """The answer headers (lower-cased) in which a provider says what is left of the organisation's
    requests and tokens; each adapter declares its own. A 429 lowers the shared budget to it."""

    requests: str
    tokens: str


def remaining_from_headers(
    lowered: Mapping[str, str], names: RemainingHeaders | None
) -> tuple[float | None, float | None]:
    """(requests, tokens) remaining by the provider's rate-limit headers (lower-cased names)."""
    if names is None:
        return None, None
    return _count(lowered, names.requests), _count(lowered, names.tokens)


def _count(lowered: Mapping[str, str], name: str) -> float | None:
    try:
        value = float(lowered[name])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


# Connections per pool of a `ShardedTransport`: httpcore's pool scans every connection for every
# queued request each time a request starts or ends, so one pool of N connections costs O(N) per
# event; at 1,000 calls in flight that scan was ~10 ms of CPU per call (`bench.real_path --in-flight`).
SHARD_CONNECTIONS = 32


class ShardedTransport(httpx2.AsyncBaseTransport):
    """An SDK client's transport as several connection pools of at most `SHARD_CONNECTIONS`
    connections each, `max_connections` in all; each pool keeps all its connections alive for the
    next call, and one TLS context serves them all.

    A request goes to the first pool with a free connection (a call holds it until its answer is
    read or closed), so a few calls at a time reuse the same few connections instead of keeping
    one per pool alive; the busiest moments spread over all of them."""

    def __init__(self, max_connections: int, proxy: str | None = None) -> None:
        shards = max(1, -(-max_connections // SHARD_CONNECTIONS))
        self._per = per = -(-max_connections // shards)
        limits = httpx2.Limits(max_connections=per, max_keepalive_connections=per)
        tls = httpx2.create_ssl_context()
        self._shards = [
            httpx2.AsyncHTTPTransport(verify=tls, limits=limits, proxy=proxy) for _ in range(shards)
        ]
        self._busy = [0] * shards

    def _pick(self) -> int:
        busy = self._busy
        for index, calls in enumerate(busy):
            if calls < self._per:
                return index
        return busy.index(min(busy))  # all full: the pool whose queue is shortest

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        index = self._pick()
        self._busy[index] += 1
        try:
            response = await self._shards[index].handle_async_request(request)
        except BaseException:
            self._busy[index] -= 1
            raise
        response.stream = _Releasing(response.stream, self._busy, index)
        return response

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()


class _Releasing(httpx2.AsyncByteStream):
    """A response body that frees its pool's slot in `ShardedTransport` once closed."""

    def __init__(self, inner: Any, busy: list[int], index: int) -> None:
        self._inner, self._busy, self._index = inner, busy, index

    async def __aiter__(self) -> Any:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._busy is not None:
                self._busy[self._index] -= 1
                self._busy = None  # type: ignore[assignment]


def connection_limits(max_connections: int | None) -> dict[str, Any]:
    """`transport=` (and `mounts=`) for an SDK's default HTTP client: `max_connections` calls in
    flight, each connection kept alive, in small pools (`ShardedTransport`), so a worker with that
    many runs in flight neither queues calls, nor opens (and, for https, handshakes) a connection
    per call, nor scans a thousand connections per request. `None`: the SDK's own (1,000, 100 kept
    alive).

    httpx reads no proxy from the environment once it is given a transport, so the proxies of
    `HTTP_PROXY` / `HTTPS_PROXY` / `ALL_PROXY` (`NO_PROXY` exempting hosts) are mounted here as
    sharded transports of their own, as the SDKs' own clients and the aiohttp stack honour them."""
    if max_connections is None:
        return {}
    mounts = {
        pattern: None if proxy is None else ShardedTransport(max_connections, proxy=proxy)
        for pattern, proxy in get_environment_proxies().items()
    }
    return {"transport": ShardedTransport(max_connections), "mounts": mounts}


# Distinct (client headers, request headers) pairs `LeanRequests` keeps merged: the SDKs' vary
# by retry count and timeout only; a header that changed on every call would only miss.
_MERGED_HEADERS_KEPT = 64
_UNMERGED = object()
_AUTO_HEADERS = frozenset({b"host", b"content-length", b"transfer-encoding"})


# A merged header list (`LeanRequests._lean_merged`): its entries, encoding and `items()` text.
_MergedHeaders = tuple[list[tuple[bytes, bytes, bytes]], str, dict[str, str]]


class _KnownTextHeaders(httpx2.Headers):
    """A lean request's headers, whose `items()` (read by the aiohttp transport for every request:
    each name and value decoded again, ~80 Python calls) is known when they are built, and given
    while the list is the one built; changed in any way, they are httpx's own."""

    def __init__(
        self, entries: list[tuple[bytes, bytes, bytes]], encoding: str, text: dict[str, str]
    ) -> None:
        self._list = entries
        self._encoding = encoding
        self._built = (list(entries), encoding, text)

    def items(self) -> ItemsView[str, str]:
        built, encoding, text = self._built
        if self._list == built and self._encoding == encoding:
            return text.items()
        return super().items()


@dataclass(frozen=True)
class _HttpxSend:
    """httpx's private names its `send` uses, which `LeanRequests._lean_send` uses in its place,
    and the methods it stands in for, as httpx defines them."""

    OPENED: Any
    CLOSED: Any
    bound_stream: Any
    logger: Any
    originals: tuple[tuple[str, Any], ...]


# `AsyncClient.send` and what it calls, which `_lean_send` does in their place; and what it reads
# of a client.
_STOOD_IN_FOR = ("send", "_send_handling_auth", "_send_handling_redirects", "_send_single_request")
_CLIENT_NAMES = ("_state", "_auth", "_event_hooks", "_default_encoding", "max_redirects", "follow_redirects")


def _httpx_send() -> _HttpxSend | None:
    """httpx's private names `send` uses; `None` (httpx's own `send`) once one of them is gone."""
    from httpx2 import _client

    state = getattr(_client, "ClientState", None)
    methods = ("_set_timeout", "_transport_for_url", "_build_redirect_request", *_STOOD_IN_FOR)
    if not all(callable(getattr(httpx2.AsyncClient, name, None)) for name in methods):
        return None
    originals = tuple((name, getattr(httpx2.AsyncClient, name)) for name in _STOOD_IN_FOR)
    try:
        return _HttpxSend(state.OPENED, state.CLOSED, _client.BoundAsyncStream, _client.logger, originals)  # type: ignore[union-attr]
    except AttributeError:
        return None


_HTTPX_SEND = _httpx_send()
# The statuses of httpx's `Response.has_redirect_location`: 301, 302, 303, 307, 308.
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


# What an SDK client's `_idempotency_key` gives when it sends no idempotency header.
UNSENT_IDEMPOTENCY_KEY = "stevora-unsent"


def idempotency_key_if_sent(client: Any, make: Callable[[], str]) -> str:
    """An SDK's `_idempotency_key` (`make`: a fresh uuid4 text, ~3 µs, for every request), made
    only when the client sends it: the key goes nowhere but its `_idempotency_header`, which
    neither API's client sets."""
    return make() if client._idempotency_header else UNSENT_IDEMPOTENCY_KEY


# Per client class: whether its clients have every name `_lean_send` reads (set by httpx's
# `__init__`, so the same for every client of a class).
_HAS_CLIENT_NAMES: dict[type, bool] = {}


def _sends_as_httpx(client: httpx2.AsyncClient) -> bool:
    """Whether `_lean_send` may stand in for httpx's `send` under `client`: not once `send` or
    what it calls is patched (an instrumentation's wrapper, on httpx's class or the SDK's) or
    overridden (by the SDK's class or a subclass), which then runs as it would have. Looked up
    on every call (~1 µs), so a patch made at any time counts."""
    http = _HTTPX_SEND
    if http is None:
        return False
    cls = type(client)
    below = super(LeanRequests, cls)  # `send` as `LeanRequests.send`'s `super()` finds it
    for name, original in http.originals:
        if (getattr(below, name) if name == "send" else getattr(cls, name)) is not original:
            return False
    found = _HAS_CLIENT_NAMES.get(cls)
    if found is None:
        found = _HAS_CLIENT_NAMES[cls] = all(hasattr(client, name) for name in _CLIENT_NAMES)
    return found


class LeanRequests(httpx2.AsyncClient):
    """An SDK's HTTP client (mixed in before its class, `lean_client`) whose `build_request`
    builds the request the stock one builds, header for header, without normalising, merging
    and re-checking the same ~20 headers again on every call (~400 Python calls of httpx's
    `Headers`, most of an SDK request's building: docs/benchmarks.md, "The real path, counted").

    The SDKs build every request the same way: the client's headers, then theirs (Anthropic's
    an `httpx2.Headers`, OpenAI's a list of pairs, differing from call to call only in the retry
    count and timeout), a URL (OpenAI's as text, joined with the base URL as httpx joins them,
    kept per text) and a bytes body. For such a request the stock merge is done once per
    distinct pair of header lists and kept (`_MERGED_HEADERS_KEPT`); the request then gets the `Host` first and
    the `Content-Length` last, as httpx's `Request` adds them. Anything else (a form, files,
    JSON, query params, cookies in the jar or given, extensions, an empty or streamed body,
    merged headers that already name the host or the length) goes through the stock
    `build_request`. Sending, retries, redirects, hooks, cookies and proxies are httpx's own."""

    _lean_headers: dict[tuple[Any, ...], _MergedHeaders | None]
    _lean_timeouts: dict[float | None, dict[str, float | None]]
    _lean_urls: tuple[httpx2.URL, dict[str, httpx2.URL]]

    def build_request(
        self,
        method: str,
        url: httpx2.URL | str,
        *,
        content: Any = None,
        data: Any = None,
        files: Any = None,
        json: Any = None,
        params: Any = None,
        headers: Any = None,
        cookies: Any = None,
        timeout: Any = httpx2.USE_CLIENT_DEFAULT,
        extensions: Any = None,
    ) -> httpx2.Request:
        entry = None
        if (
            type(content) is bytes
            and content
            and type(headers) in (httpx2.Headers, list)
            and type(url) in (httpx2.URL, str)
            and data is None
            and files is None
            and json is None
            and params is None
            and cookies is None
            and extensions is None
            and not self.params
            and not self.cookies
        ):
            entry = self._lean_merged(headers)
        if entry is None:
            return super().build_request(
                method,
                url,
                content=content,
                data=data,
                files=files,
                json=json,
                params=params,
                headers=headers,
                cookies=cookies,
                timeout=timeout,
                extensions=extensions,
            )
        merged = self._lean_url(url) if type(url) is str else self._merge_url(url)
        host = merged.host
        if not host:
            return super().build_request(method, url, content=content, headers=headers, timeout=timeout)
        request = httpx2.Request(
            method,
            merged,
            stream=httpx2.ByteStream(content),
            extensions={"timeout": self._lean_timeout(timeout)},
        )
        headers_list, encoding, text = entry
        length = str(len(content))
        request.headers = _KnownTextHeaders(
            [
                (b"Host", b"host", merged.netloc),
                *headers_list,
                (b"Content-Length", b"content-length", length.encode()),
            ],
            # What `Headers.encoding` would work out on first use (decoding every header twice):
            # the host and the length are ASCII, so it is the merged headers' own.
            encoding,
            {"host": merged.netloc.decode(encoding), **text, "content-length": length},
        )
        request.read()
        return request

    async def send(
        self,
        request: httpx2.Request,
        *,
        stream: bool = False,
        auth: Any = httpx2.USE_CLIENT_DEFAULT,
        follow_redirects: Any = httpx2.USE_CLIENT_DEFAULT,
    ) -> httpx2.Response:
        """httpx's `send`, the request marked with whether its answer is read whole at once
        (`READ_WHOLE`: not streamed), for the lean aiohttp transport (`lean_aiohttp`).

        As the SDKs send (no auth given, none on the client or in the URL, an async body),
        httpx's `send` is done in one coroutine (`_lean_send`): its auth flow, an async
        generator that gives back the request unchanged, and three nested coroutines go
        (~25 µs a call), and a plain answer is read by `read_whole`. httpx's own `send` runs
        for anything else, and once it or what it calls is patched or overridden
        (`_sends_as_httpx`). The one visible difference: httpx's log line of the request
        ("HTTP Request: ...", logger `httpx2`) names this function as where it was made."""
        request.extensions[READ_WHOLE] = not stream
        default = type(httpx2.USE_CLIENT_DEFAULT)
        if (
            not _sends_as_httpx(self)
            or not isinstance(auth, default)
            or self._state is cast(_HttpxSend, _HTTPX_SEND).CLOSED
            or self._auth is not None
            or request.url.userinfo
            or self.max_redirects < 0
            or not isinstance(request.stream, httpx2.AsyncByteStream)
        ):
            return await super().send(request, stream=stream, auth=auth, follow_redirects=follow_redirects)
        follow = self.follow_redirects if isinstance(follow_redirects, default) else bool(follow_redirects)
        return await self._lean_send(request, stream, follow)

    async def _lean_send(self, request: httpx2.Request, stream: bool, follow: bool) -> httpx2.Response:
        """httpx's `send` → `_send_handling_auth` (no auth) → `_send_handling_redirects` →
        `_send_single_request`, step for step: the same hooks, cookies, log line, timing,
        redirects (from the first on, httpx's own loop) and errors."""
        http = cast(_HttpxSend, _HTTPX_SEND)
        self._state = http.OPENED
        self._set_timeout(request)
        for hook in self._event_hooks["request"]:
            await hook(request)
        transport = self._transport_for_url(request.url)
        start = time.perf_counter()
        try:
            response = await transport.handle_async_request(request)
        except httpx2.RequestError as exc:  # httpx's `request_context`
            exc.request = request
            raise
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.request = request
        response.stream = http.bound_stream(response.stream, start=start)
        self.cookies.extract_cookies(response)
        response.default_encoding = self._default_encoding
        http.logger.info(
            'HTTP Request: %s %s "%s %d %s"',
            request.method,
            request.url,
            response.http_version,
            response.status_code,
            response.reason_phrase,
        )
        redirect = None
        try:
            for hook in self._event_hooks["response"]:
                await hook(response)
            response.history = []
            # `response.has_redirect_location`, without its five lookups of httpx's status codes.
            if response.status_code in _REDIRECT_STATUSES and "Location" in response.headers:
                if follow:
                    redirect = self._build_redirect_request(request, response)
                    await response.aread()
                else:
                    with suppress(httpx2.RemoteProtocolError):
                        response.next_request = self._build_redirect_request(request, response)
        except BaseException:
            await response.aclose()
            raise
        if redirect is not None:
            response = await self._send_handling_redirects(
                redirect, follow_redirects=True, history=[response]
            )
        try:
            if not stream and await read_whole(response) is None:
                await response.aread()
            return response
        except BaseException:
            await response.aclose()
            raise

    def _lean_url(self, url: str) -> httpx2.URL:
        """`_merge_url(url)` made once per URL text and base URL (an `httpx2.URL` is immutable)."""
        return url_made_once(self, "_lean_urls", self.base_url, url, self._merge_url)

    def _lean_merged(self, headers: httpx2.Headers | list[Any]) -> _MergedHeaders | None:
        """The client's headers merged with `headers` (the SDK's `httpx2.Headers`, or a list of
        pairs) as httpx merges them (its `_merge_headers`), with their `encoding` and their
        `items()`, made once per pair of header lists; `None` when they name what `Request`
        would add, or are not pairs of text."""
        try:
            kept = self._lean_headers
        except AttributeError:
            kept = self._lean_headers = {}
        # The entries themselves (raw name, lowercase name, value), not `.raw`: the same key
        # without a list of pairs built per request.
        key = (
            tuple(self.headers._list),
            tuple(headers._list) if type(headers) is httpx2.Headers else tuple(headers),
        )
        try:
            entry = kept.get(key, _UNMERGED)
        except TypeError:  # an unhashable pair: httpx's own merge
            return None
        if entry is _UNMERGED:
            merged = cast(httpx2.Headers, self._merge_headers(headers))
            found = list(merged._list)
            if any(lower in _AUTO_HEADERS for _, lower, _ in found):
                entry = None
            else:
                fresh = httpx2.Headers(merged)  # its encoding worked out as a request's would be
                entry = (found, fresh.encoding, dict(fresh.items()))
            if len(kept) >= _MERGED_HEADERS_KEPT:
                kept.clear()
            kept[key] = entry
        return cast("_MergedHeaders | None", entry)

    def _lean_timeout(self, timeout: Any) -> dict[str, float | None]:
        """The request's `timeout` extension as `build_request` writes it."""
        if isinstance(timeout, float | int) or timeout is None:
            try:
                timeouts = self._lean_timeouts
            except AttributeError:
                timeouts = self._lean_timeouts = {}
            found = timeouts.get(timeout)
            if found is None:
                found = timeouts[timeout] = httpx2.Timeout(timeout).as_dict()
            return dict(found)
        chosen = (
            self.timeout if isinstance(timeout, type(httpx2.USE_CLIENT_DEFAULT)) else httpx2.Timeout(timeout)
        )
        return chosen.as_dict()


def url_made_once(
    owner: Any, name: str, base: httpx2.URL, url: str, make: Callable[[str], httpx2.URL]
) -> httpx2.URL:
    """`make(url)`, kept on `owner` (its attribute `name`) per URL text while its base URL is the
    same object (a new base URL starts afresh), at most `_MERGED_HEADERS_KEPT` texts."""
    kept: tuple[httpx2.URL, dict[str, httpx2.URL]] | None = getattr(owner, name, None)
    if kept is None or kept[0] is not base:
        kept = (base, {})
        setattr(owner, name, kept)
    urls = kept[1]
    found = urls.get(url)
    if found is None:
        if len(urls) >= _MERGED_HEADERS_KEPT:
            urls.clear()
        found = urls[url] = make(url)
    return found


# What an adapter keeps on its SDK client, built once (the request options per timeout, the
# headers per value of what they read): at most this many of each.
KEPT_PER_CLIENT = 16
_T = TypeVar("_T")


def kept_on(client: Any, name: str) -> dict[Any, Any]:
    """The cache `name` kept on `client`, made empty on first use."""
    kept: dict[Any, Any] | None = getattr(client, name, None)
    if kept is None:
        kept = {}
        setattr(client, name, kept)
    return kept


def timeout_key(timeout: Any, not_given: type) -> Any:
    """A timeout as a key: an `httpx2.Timeout` compares by identity, its four values do not; `30`
    and `30.0` are equal keys but the SDKs' timeout headers write them apart; the SDK's
    `not_given` (a new one in each options the SDK builds, compared by identity) is one value."""
    if isinstance(timeout, httpx2.Timeout):
        return tuple([(k, type(v), v) for k, v in timeout.as_dict().items()])
    return not_given if isinstance(timeout, not_given) else (type(timeout), timeout)


def made_once(client: Any, name: str, key: Any, build: Callable[[], _T]) -> _T:
    """`build()`, kept on `client` (its cache `name`, at most `KEPT_PER_CLIENT` values) per `key`;
    built afresh, and not kept, for a key that cannot be hashed."""
    kept: dict[Any, _T] = kept_on(client, name)
    try:
        found = kept.get(key)
    except TypeError:
        return build()
    if found is None:
        if len(kept) >= KEPT_PER_CLIENT:
            kept.clear()
        found = kept[key] = build()
    return found


def headers_made_once(
    client: Any, key: tuple[Any, ...], build: Callable[[], httpx2.Headers]
) -> httpx2.Headers:
    """`build()` (an SDK's `_build_headers`), kept on `client` per `key` (the value of everything
    it reads) and copied for each request (the SDK may change its copy); built afresh for a key
    that cannot be hashed (an unhashable header value)."""
    return made_once(client, "_stevora_headers", key, build).copy()


_LEAN_CLASSES: dict[type, type] = {}


def lean_client(cls: Callable[..., httpx2.AsyncClient]) -> Callable[..., httpx2.AsyncClient]:
    """`cls` (an SDK's HTTP client class) with `LeanRequests` mixed in before it."""
    if not isinstance(cls, type):
        return cls
    lean = _LEAN_CLASSES.get(cls)
    if lean is None:
        lean = _LEAN_CLASSES[cls] = type(f"Lean{cls.__name__}", (LeanRequests, cls), {})
    return lean


# The HTTP stack under an SDK client (`STEVORA_PROVIDER_HTTP`): the SDK's aiohttp transport (its
# HTTP parser and connection pool in C and compiled code: about 1,400-1,800 fewer Python calls per
# model call than httpcore, h11 and anyio, docs/benchmarks.md) or httpx's own.
HttpStack = Literal["aiohttp", "httpx"]
_FELL_BACK: list[bool] = []


def sdk_http_client(
    httpx_client: Callable[..., httpx2.AsyncClient],
    aiohttp_client: Callable[..., httpx2.AsyncClient],
    hooks: list[Callable[[httpx2.Response], Awaitable[None]]],
    max_connections: int | None,
    http: HttpStack = "aiohttp",
) -> httpx2.AsyncClient:
    """An SDK's HTTP client (`openai.DefaultAsyncHttpxClient` / `DefaultAioHttpClient`, or
    Anthropic's) with the response `hooks` installed and `max_connections` calls in flight, every
    connection kept alive for the next call.

    aiohttp: one pool of `max_connections` (its pool finds a free connection without scanning them
    all, so it needs no `ShardedTransport`), idle connections closed after httpx's keep-alive
    expiry (5 s), timeouts and the SDK's retries as with httpx. httpx: `connection_limits`. When
    aiohttp is not installed, httpx (with one warning)."""
    if http == "aiohttp":
        limits = (
            {}
            if max_connections is None
            else {
                "limits": httpx2.Limits(
                    max_connections=max_connections, max_keepalive_connections=max_connections
                )
            }
        )
        try:
            client = lean_client(aiohttp_client)(event_hooks={"response": hooks}, **limits)
            client._transport = lean_transport(client._transport)
            return client
        except RuntimeError as exc:  # the SDK's stand-in when aiohttp cannot be imported
            if not _FELL_BACK:
                _FELL_BACK.append(True)
                structlog.get_logger("stevora.llm").warning(
                    "provider_http_fallback", http="httpx", reason=str(exc)
                )
    return lean_client(httpx_client)(event_hooks={"response": hooks}, **connection_limits(max_connections))


def deadline(timeout_s: float | None) -> float | None:
    """The event-loop time by which a call of `timeout_s` (the step's `timeoutMs`) must be over,
    for `asyncio.timeout_at`: it bounds the whole call, from sending the request (the SDKs'
    transports bound connecting and each read, not a body written to a peer that reads nothing)
    to the answer's last byte; `None`: unbounded."""
    return None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s


# The largest token count a trace row holds (`llm_calls`' counts are PostgreSQL `integer`s): a
# larger or negative one is a hostile answer, refused here rather than by the checkpoint's write.
MAX_COUNT = 2**31 - 1


def checked_response(response: LlmResponse) -> LlmResponse:
    """`response` if each field has its type, else `TypeError` naming the first that does not: an
    answer read as JSON (or built unvalidated by an SDK) may hold anything where a string or a
    count belongs, and it must fail as the adapter's `ProviderError`, not later in the engine."""
    fields: list[tuple[str, object, type | tuple[type, ...]]] = [
        ("text", response.text, (str, type(None))),
        ("model", response.model, str),
        ("finish_reason", response.finish_reason, str),
        ("response id", response.response_id, (str, type(None))),
    ]
    for call in response.tool_calls:
        fields += [("tool call id", call.id, str), ("tool name", call.name, str)]
        fields.append(("tool arguments", call.arguments, str))
    usage = response.usage
    for name in (
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
    ):
        value = getattr(usage, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"the answer's {name} is {type(value).__name__}, not a count")
        if not 0 <= value <= MAX_COUNT:
            raise ValueError(f"the answer's {name} is {value}, not a count")
    for name, value, kind in fields:
        if not isinstance(value, kind):
            raise TypeError(f"the answer's {name} is {type(value).__name__}")
    return response


# What reading an answer of the wrong shape or types raises (json, dict access, `checked_response`).
MALFORMED: tuple[type[Exception], ...] = (ValueError, LookupError, TypeError, AttributeError)


def malformed_answer(provider: str, what: str, exc: Exception) -> ProviderError:
    """A 200 whose body is not `what` (e.g. "a chat completion"): retryable, as the next answer may be."""
    return ProviderError(
        f"{provider} answered with something that is not {what}: {exc}", provider=provider, retryable=True
    )


def connection_error(provider: str, detail: str) -> ProviderError:
    return ProviderError(f"{provider} connection failed: {detail}", provider=provider, retryable=True)


def timeout_error(provider: str) -> ProviderError:
    return ProviderError(f"{provider} request timed out", provider=provider, retryable=True)


def mentions_json(messages: list[Message]) -> bool:
    return any("json" in (m.content or "").lower() for m in messages)


def part_base64(part: Part) -> str:
    """An image's or file's bytes as base64, for the wire; the engine loads them before a call."""
    if part.data is None:
        raise ProviderError(
            f"attachment {part.sha256} was not loaded before the call", provider="stevora", retryable=False
        )
    return base64.b64encode(part.data).decode("ascii")


def data_url(part: Part) -> str:
    return f"data:{part.media_type};base64,{part_base64(part)}"


def parse_tool_input(arguments: str) -> dict[str, Any]:
    """Arguments as an object for APIs that want one (Anthropic `tool_use.input`).

    What tool handlers receive (`stevora.tools.invoke.parse_arguments`): empty -> `{}`, a JSON
    object -> itself (NUL and lone surrogates as U+FFFD, which the SDK can encode), anything else
    (or an object nested past 64 levels) -> `{"raw": <the original string>}`, so the model sees
    what it sent.
    """
    return parse_arguments(arguments)[0]
