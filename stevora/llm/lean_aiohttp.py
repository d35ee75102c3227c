"""The SDKs' aiohttp transport (`<sdk>._vendor.httpx_aiohttp.AiohttpTransport`) without the
per-request work that gives the same result every time.

The SDKs' `DefaultAioHttpClient` sends each request through their vendored copy of
`httpx-aiohttp`. For every request it turns the URL back into text (which aiohttp parses again),
builds an `aiohttp.ClientTimeout`, decodes every response header into an `httpx2.Headers`
(each name and value checked and encoded again) and reads a body of one JSON answer through
aiohttp's chunk iterator and httpx's, each read inside a context manager of its own
(docs/benchmarks.md, "The real path, counted").

`lean_transport(transport)` gives the same transport object a subclass whose
`handle_async_request` sends the same request with the same arguments (aiohttp's URL made once
per URL text, the timeout once per value), maps aiohttp's exceptions with the SDK's own
`map_aiohttp_exceptions` (the two SDKs map them differently), and answers an `httpx2.Response`
with the same status, headers (in order, as sent), extensions and bytes. The answer to a request
whose caller reads it whole at once (`READ_WHOLE`: httpx's `send` without `stream`) is read in
one `read()`; any other (a stream) as the SDK's transport reads it, chunk by chunk as it
arrives. Anything the transport does not recognise (a proxy, a streamed request body) goes
through the SDK's own code."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import httpx2
from httpx2 import _client as _httpx_client

if TYPE_CHECKING:
    from aiohttp import ClientTimeout
    from yarl import URL

# A request's extension saying its caller reads the answer whole at once (httpx's `send` without
# `stream`, marked by `provider.LeanRequests.send`): then one `read()`, else chunk by chunk.
READ_WHOLE = "stevora_read_whole"

# URLs and timeouts kept per transport: a worker sends to a handful of URLs with a few timeouts.
_KEPT = 64
_LEAN_TRANSPORTS: dict[type, type] = {}


def lean_transport(transport: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
    """`transport` itself, its class swapped for the lean subclass when it is an SDK's vendored
    `AiohttpTransport` (exactly: a subclass of it may do anything)."""
    cls = type(transport)
    if cls.__name__ != "AiohttpTransport" or not cls.__module__.endswith("._vendor.httpx_aiohttp.transport"):
        return transport
    _import_aiohttp()
    lean = _LEAN_TRANSPORTS.get(cls)
    if lean is None:
        module = sys.modules[cls.__module__]
        mapper = getattr(module, "map_aiohttp_exceptions", None)
        if mapper is None:  # an SDK whose vendored transport has changed shape: its own
            return transport
        lean = _LEAN_TRANSPORTS[cls] = type(
            f"Lean{cls.__name__}", (_LeanAiohttp, cls), {"_map_exceptions": staticmethod(mapper)}
        )
    transport.__class__ = lean
    return transport


def _import_aiohttp() -> None:
    """aiohttp's names, imported by the first lean transport (a process that has one has aiohttp;
    one without it, whose SDK clients fall back to httpx, never imports it here)."""
    global _ClientSession, _ClientTimeout, _URL
    if _URL is None:
        from aiohttp import ClientSession, ClientTimeout
        from yarl import URL

        _ClientSession, _ClientTimeout, _URL = ClientSession, ClientTimeout, URL


_ClientSession: Any = None
_ClientTimeout: Any = None
_URL: Any = None


class _LeanAiohttp(httpx2.AsyncBaseTransport):
    """Mixed in before the SDK's `AiohttpTransport` (`lean_transport`)."""

    _map_exceptions: Callable[[], Any]
    _lean_urls: dict[httpx2.URL, URL]
    _lean_timeouts: dict[tuple[float | None, ...], ClientTimeout]
    client: Any
    proxy: httpx2.Proxy | None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            content = request.content
        except httpx2.RequestNotRead:  # a streamed body: the SDK's transport sends it
            content = None
        if self.proxy is not None or content is None:
            return await super().handle_async_request(request)
        session = self.client
        if not isinstance(session, _ClientSession):
            session = self.client = self.get_client()  # type: ignore[attr-defined]
        extensions = request.extensions
        with self._map_exceptions():
            response = await session.request(
                method=request.method,
                url=self._aiohttp_url(request.url),
                headers=request.headers,
                data=content or None,
                allow_redirects=False,
                auto_decompress=False,
                compress=False,
                timeout=self._aiohttp_timeout(extensions.get("timeout")),
                server_hostname=extensions.get("sni_hostname"),
                proxy=None,
                proxy_auth=None,
                proxy_headers=None,
            ).__aenter__()
        answer = httpx2.Response(
            status_code=response.status,
            stream=_Body(response, self._map_exceptions, whole=extensions.get(READ_WHOLE) is True),
            request=request,
            extensions=(
                {"http_version": b"HTTP/1.1", "reason_phrase": response.reason.encode()}
                if response.reason
                else {"http_version": b"HTTP/1.1"}
            ),
        )
        # The headers as `httpx2.Headers(raw_headers)` makes them, without checking each pair
        # (aiohttp's are bytes already).
        answer.headers._list = [(name, name.lower(), value) for name, value in response.raw_headers]
        return answer

    def _aiohttp_url(self, url: httpx2.URL) -> URL | str:
        """aiohttp's URL for `url`, parsed from its text as aiohttp parses a text URL."""
        try:
            kept = self._lean_urls
        except AttributeError:
            kept = self._lean_urls = {}
        found = kept.get(url)
        if found is None:
            if len(kept) >= _KEPT:
                kept.clear()
            text = str(url) if url else "https://127.0.0.1:8000/"
            try:
                found = _URL(text)
            except ValueError:  # as text: aiohttp's own parse raises its mapped error
                return text
            kept[url] = found
        return found

    def _aiohttp_timeout(self, timeout: dict[str, float | None] | None) -> Any:
        """The SDK transport's `ClientTimeout` for the request's timeout extension."""
        timeout = timeout or {}
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        try:
            kept = self._lean_timeouts
        except AttributeError:
            kept = self._lean_timeouts = {}
        found = kept.get(key)
        if found is None:
            if len(kept) >= _KEPT:
                kept.clear()
            found = kept[key] = _ClientTimeout(sock_connect=key[0], sock_read=key[1], connect=key[2])
        return found


class _Body(httpx2.AsyncByteStream):
    """An aiohttp response's body for httpx: in one `read()` when the caller reads it whole at
    once anyway (`whole`: httpx's `send` without `stream`), else chunk by chunk as it arrives,
    as the SDK's transport reads it."""

    def __init__(self, response: Any, map_exceptions: Callable[[], Any], *, whole: bool) -> None:
        self._response = response
        self._map_exceptions = map_exceptions
        self._whole = whole

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._whole:
            body = await self.read()
            if body:
                yield body
            return
        with self._map_exceptions():
            async for chunk in self._response.content.iter_chunked(16 * 1024):
                yield chunk

    async def read(self) -> bytes:
        """The whole body, in one aiohttp `read()`."""
        with self._map_exceptions():
            body: bytes = await self._response.read()
        return body

    async def aclose(self) -> None:
        with self._map_exceptions():
            await self._response.__aexit__(None, None, None)


# httpx wraps a transport's answer in this to time it (`httpx2._client`); `None` if it goes.
_BoundAsyncStream: Any = getattr(_httpx_client, "BoundAsyncStream", None)


async def read_whole(response: httpx2.Response) -> bytes | None:
    """`response.aread()` for an answer of a lean transport read whole (`READ_WHOLE`) in no
    content coding: its body from one aiohttp `read()`, without httpx's three nested async
    iterators (decoder, chunker, raw), each in a context manager of its own (~30 µs a call).
    The response ends as `aread` leaves it: content kept, bytes counted, stream consumed and
    closed (its `elapsed` set), a transport error carrying the request. `None` for any other
    answer, which `aread` reads."""
    stream: Any = response.stream
    body = stream._stream if type(stream) is _BoundAsyncStream else stream
    if (
        type(body) is not _Body
        or not body._whole
        or hasattr(response, "_content")
        or response.is_stream_consumed
        or response.is_closed
        or "content-encoding" in response.headers  # httpx decodes it
    ):
        return None
    response.is_stream_consumed = True
    response._num_bytes_downloaded = 0
    try:
        content = await body.read()
        response._num_bytes_downloaded = len(content)
    except httpx2.RequestError as exc:  # as httpx's `request_context` around the read
        if response._request is not None:
            exc.request = response._request
        raise
    finally:  # closed, read or not, as `aiter_raw` leaves it
        await response.aclose()
    response._content = content
    return content
