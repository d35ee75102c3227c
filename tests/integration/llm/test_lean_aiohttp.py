"""`lean_transport` (stevora.llm.lean_aiohttp): the SDKs' aiohttp transport, its per-request
rebuilding made once, answers exactly what the SDK's own transport answers (status, reason,
headers in order, duplicates and case kept, bytes, decoded bodies), reads an event stream as it
arrives, and raises each SDK's own exception for each failure."""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import anthropic
import httpx2
import openai
import pytest

from stevora.llm.lean_aiohttp import READ_WHOLE, lean_transport, read_whole
from stevora.llm.provider import lean_client
from tests.integration.llm.raw_http import raw_http_server

_SDKS = {"anthropic": anthropic.DefaultAioHttpClient, "openai": openai.DefaultAioHttpClient}


def _chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


_JSON = b'{"id": "msg_1", "text": "h\xc3\xa9llo"}'
_ZIPPED = gzip.compress(_JSON)

# Raw answers, each a whole HTTP/1.1 response, by request path.
_ANSWERS: dict[bytes, bytes] = {
    b"/json": b"HTTP/1.1 201 Made It\r\ncontent-type: application/json\r\nSet-Cookie: a=1\r\n"
    b"X-Mixed-Case: One\r\nset-cookie: b=2\r\nx-mixed-case: two\r\n"
    + f"content-length: {len(_JSON)}\r\n\r\n".encode()
    + _JSON,
    b"/gzip": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
    + f"content-length: {len(_ZIPPED)}\r\n\r\n".encode()
    + _ZIPPED,
    b"/chunked": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"".join(_chunk(part) for part in (_JSON[:7], _JSON[7:]))
    + b"0\r\n\r\n",
    b"/empty": b"HTTP/1.1 204 No Content\r\n\r\n",
    b"/broken": b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"cut',
}


@contextmanager
def _server(on_request: Callable[[bytes, socket.socket], None] | None = None) -> Iterator[str]:
    """A keep-alive HTTP/1.1 server answering `_ANSWERS` by path (a `/broken` answer is cut short
    and its connection closed); `on_request(path, conn)` answers instead when given."""

    def answer(head: bytes, _body: bytes, conn: socket.socket) -> bool:
        path = head.split(b" ", 2)[1]
        if on_request is not None:
            on_request(path, conn)
            return False
        conn.sendall(_ANSWERS[path])
        return path != b"/broken"

    with raw_http_server(answer) as url:
        yield url


def _clients(sdk: str) -> tuple[httpx2.AsyncClient, httpx2.AsyncClient]:
    """The SDK's own aiohttp client, and the same as Stevora builds it (`LeanRequests`, which marks
    what is read whole) with its transport made lean."""
    stock, lean = _SDKS[sdk](), lean_client(_SDKS[sdk])()
    lean._transport = lean_transport(lean._transport)
    assert type(lean._transport).__name__ == "LeanAiohttpTransport"
    assert type(stock._transport).__name__ == "AiohttpTransport"
    return stock, lean


def _seen(response: httpx2.Response) -> dict[str, Any]:
    return {
        "status": response.status_code,
        "reason": response.reason_phrase,
        "version": response.http_version,
        "headers": response.headers.raw,
        "header text": list(response.headers.items()),
        "cookies": response.headers.get_list("set-cookie"),
        "content": response.content,
        "elapsed": response.elapsed is not None,
        # What `aread` leaves behind (`read_whole` reads a plain answer in its place).
        "read": (response.is_stream_consumed, response.is_closed, response.num_bytes_downloaded),
        "url": str(response.url),
        "history": [(r.status_code, str(r.url), r.content, r.is_closed) for r in response.history],
    }


@pytest.mark.parametrize("sdk", sorted(_SDKS))
async def test_every_answer_is_the_sdk_transports_own(sdk: str) -> None:
    stock, lean = _clients(sdk)
    try:
        with _server() as url:
            for path in ("/json", "/gzip", "/chunked", "/empty", "/json"):
                sent = {"content": b'{"q": 1}', "headers": {"content-type": "application/json"}}
                theirs = await stock.post(f"{url}{path}", **sent)
                with pytest.MonkeyPatch.context() as patched:  # read whole: not chunk by chunk
                    patched.setattr(aiohttp.StreamReader, "iter_chunked", lambda *_: pytest.fail("chunked"))
                    ours = await lean.post(f"{url}{path}", **sent)
                assert _seen(ours) == _seen(theirs), path
                if path in ("/gzip", "/chunked"):
                    assert ours.content == _JSON  # decoded by httpx, as the stock transport's
            # The URL and the timeout were made once for the two requests to /json.
            transport: Any = lean._transport
            assert len(transport._lean_urls) == 4 and len(transport._lean_timeouts) == 1
    finally:
        await stock.aclose()
        await lean.aclose()


def _no_auth_flow(patched: pytest.MonkeyPatch) -> None:
    """httpx's own `send` fails from here on: it runs every request through an auth flow."""
    patched.setattr(httpx2.Auth, "async_auth_flow", lambda *_: pytest.fail("httpx's own send"))


@pytest.mark.parametrize("sdk", sorted(_SDKS))
async def test_a_plain_answer_is_sent_and_read_without_httpxs_auth_flow_and_iterators(sdk: str) -> None:
    """`LeanRequests.send` does httpx's `send` in one coroutine (no auth flow) and `read_whole`
    reads a plain answer in one `read()` (none of httpx's iterators); a coded body still goes
    through httpx's decoder."""
    _, lean = _clients(sdk)
    try:
        with _server() as url, pytest.MonkeyPatch.context() as patched:
            _no_auth_flow(patched)
            for path in ("/json", "/empty"):
                with pytest.MonkeyPatch.context() as no_iterators:
                    no_iterators.setattr(httpx2.Response, "aiter_raw", lambda *_: pytest.fail("aiter_raw"))
                    response = await lean.post(f"{url}{path}", content=b"{}")
                assert response.content == (_JSON if path == "/json" else b"")
                assert response.is_closed and response.elapsed is not None
            assert (await lean.post(f"{url}/gzip", content=b"{}")).content == _JSON
    finally:
        await lean.aclose()


def _hooked(sdk: str, lean: bool, calls: list[Any], **kwargs: Any) -> httpx2.AsyncClient:
    """The SDK's aiohttp client (as Stevora builds it when `lean`) with a request and a response
    hook that record what they are called with in `calls`."""

    async def on_request(request: httpx2.Request) -> None:
        calls.append(("request", str(request.url), None))

    async def on_response(response: httpx2.Response) -> None:
        calls.append(("response", str(response.request.url), response.status_code, response))

    hooks = {"event_hooks": {"request": [on_request], "response": [on_response]}}
    if not lean:
        return _SDKS[sdk](**hooks, **kwargs)
    client = lean_client(_SDKS[sdk])(**hooks, **kwargs)
    client._transport = lean_transport(client._transport)
    return client


@pytest.mark.parametrize(
    ("status", "follow"), [(301, True), (302, True), (303, True), (307, True), (308, True), (307, False)]
)
async def test_hooks_cookies_redirects_and_the_log_line_are_httpxs_own(
    status: int, follow: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The same hooks called with the same requests and answers, the same cookies kept, the same
    redirect followed (its history read and closed) or left as `next_request`, the same log
    line, encoding and client state as httpx's own `send`, for every redirect status."""
    seen: dict[str, Any] = {}

    def redirect(path: bytes, conn: socket.socket) -> None:
        if path == b"/json":
            conn.sendall(_ANSWERS[b"/json"])
        else:
            conn.sendall(
                f"HTTP/1.1 {status} Elsewhere\r\nlocation: /json\r\nset-cookie: r=0\r\n".encode()
                + b"connection: close\r\ncontent-length: 5\r\n\r\nmoved"
            )

    with _server(redirect) as url, pytest.MonkeyPatch.context() as patched:
        for lean in (False, True):
            if lean:
                _no_auth_flow(patched)
            calls: list[Any] = []
            client = _hooked("anthropic", lean, calls, follow_redirects=follow, default_encoding="latin-1")
            try:
                caplog.clear()
                with caplog.at_level("INFO", logger="httpx2"):
                    response = await client.post(f"{url}/redirect", content=b'{"q": 1}')
                following = response.next_request
                with pytest.raises(RuntimeError) as reopened:  # the client is open: httpx's state
                    await client.__aenter__()
                seen["lean" if lean else "stock"] = {
                    **_seen(response),
                    "encoding": response.encoding,
                    "calls": [call[:3] for call in calls],
                    "cookies": sorted(client.cookies.items()),
                    "next": None if following is None else (following.method, str(following.url)),
                    "log": [r.getMessage().replace(url, "URL") for r in caplog.records],
                    "reopened": str(reopened.value),
                }
            finally:
                await client.aclose()
    assert seen["lean"] == seen["stock"]
    got = seen["lean"]
    if follow:
        assert got["status"] == 201 and len(got["history"]) == 1
        assert got["cookies"] == [("a", "1"), ("b", "2"), ("r", "0")]
    else:
        assert got["status"] == status and got["encoding"] == "latin-1"
        assert got["cookies"] == [("r", "0")] and got["next"] == ("POST", f"{url}/json")


class _OwnSingleRequest(anthropic.DefaultAioHttpClient):
    """A client class that overrides what httpx's `send` calls."""

    async def _send_single_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["x-own"] = "1"
        return await super()._send_single_request(request)


# What httpx's own `send` (or the aiohttp transport under it) answers these cases with.
_REFUSED: dict[str, type[Exception]] = {
    "userinfo": ValueError,  # aiohttp: credentials in the URL and httpx's Authorization header
    "no redirects": httpx2.TooManyRedirects,
}


_STOOD_IN_FOR = ["send", "_send_handling_auth", "_send_handling_redirects", "_send_single_request"]


@pytest.mark.parametrize(
    "case",
    [
        "sdk path",
        "auth given",
        "client auth",
        "userinfo",
        "no redirects",
        *(f"patched {name}" for name in _STOOD_IN_FOR),
        "patched on the SDK's class after a send",
        "override",
        "override in a subclass",
    ],
)
async def test_a_request_off_the_sdks_path_takes_httpxs_own_send(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Auth (given, on the client or in the URL), a negative redirect limit, an instrumentation's
    patch of httpx's `send` or of anything it calls (on httpx's class, or on the SDK's after the
    client has sent), or a client class's override of what it calls: httpx's own `send` runs,
    and what patched or overrode it too. As the SDKs send: `_lean_send`, and the request still
    gets its timeout from the client as httpx's `send` gives it."""
    flows: list[httpx2.Request] = []
    own_flow = httpx2.Auth.async_auth_flow

    def counted(auth: httpx2.Auth, request: httpx2.Request) -> Any:
        flows.append(request)
        return own_flow(auth, request)

    monkeypatch.setattr(httpx2.Auth, "async_auth_flow", counted)
    patched: list[str] = []

    def instrument(owner: type, name: str) -> None:
        own = getattr(owner, name)

        async def instrumented(self: httpx2.AsyncClient, *args: Any, **kwargs: Any) -> Any:
            patched.append(name)
            return await own(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, instrumented)

    if case.startswith("patched _") or case == "patched send":
        instrument(httpx2.AsyncClient, case.removeprefix("patched "))
    kwargs: dict[str, Any] = {"timeout": httpx2.Timeout(7.0)}
    if case == "client auth":
        kwargs["auth"] = ("user", "secret")
    if case == "no redirects":
        kwargs["max_redirects"] = -1
    cls: Any = lean_client(_OwnSingleRequest if case == "override" else anthropic.DefaultAioHttpClient)
    if case == "override in a subclass":

        class Below(cls):  # type: ignore[misc,valid-type]
            async def _send_handling_redirects(self, *args: Any, **kwargs: Any) -> Any:
                patched.append("below")
                return await super()._send_handling_redirects(*args, **kwargs)

        cls = Below
    client = cls(**kwargs)
    client._transport = lean_transport(client._transport)
    try:
        with _server() as url:
            if case == "patched on the SDK's class after a send":
                assert (await client.post(f"{url}/json", content=b"{}")).content == _JSON
                assert flows == []  # sent by `_lean_send`
                instrument(anthropic.DefaultAioHttpClient, "_send_single_request")
            target = url.replace("http://", "http://user:secret@") if case == "userinfo" else url
            request = httpx2.Request("POST", f"{target}/json", content=b"{}")  # no timeout of its own
            given = {"auth": ("user", "secret")} if case == "auth given" else {}
            if case in _REFUSED:  # by httpx's own `send`, or the SDK's transport under it
                with pytest.raises(_REFUSED[case]):
                    await client.send(request, **given)
            else:
                assert (await client.send(request, **given)).content == _JSON
        assert request.extensions["timeout"] == httpx2.Timeout(7.0).as_dict()
        assert len(flows) == (0 if case == "sdk path" else 1), case
        expected = {
            "override in a subclass": ["below"],
            "patched on the SDK's class after a send": ["_send_single_request"],
        }.get(case, [case.removeprefix("patched ")] if case.startswith("patched") else [])
        assert patched == expected
        assert ("x-own" in request.headers) == (case == "override")
    finally:
        await client.aclose()


@pytest.mark.parametrize("sdk", sorted(_SDKS))
async def test_an_answer_cut_short_is_closed_as_httpx_closes_it(sdk: str) -> None:
    """The answer whose body fails to arrive ends closed, with its request on the error."""
    closed = []
    for lean in (False, True):
        calls: list[Any] = []
        client = _hooked(sdk, lean, calls)
        try:
            with _server() as url, pytest.raises(httpx2.HTTPError) as cut:
                await client.post(f"{url}/broken", content=b"{}")
            answer = calls[-1][3]
            closed.append((answer.is_closed, answer.is_stream_consumed, cut.value.request.url.path))
        finally:
            await client.aclose()
    assert closed == [(True, True, "/broken")] * 2
    # `read_whole` itself, on the transport's answer, before any `send` would close it.
    _, lean_client_ = _clients(sdk)
    try:
        with _server() as url:
            request = lean_client_.build_request("POST", f"{url}/broken", content=b"{}")
            request.extensions[READ_WHOLE] = True
            answer = await lean_client_._transport.handle_async_request(request)
            with pytest.raises(httpx2.HTTPError) as cut:
                await read_whole(answer)
        assert answer.is_closed and cut.value.request is request
    finally:
        await lean_client_.aclose()


async def test_a_closed_client_refuses_to_send_as_httpxs_own() -> None:
    lean = lean_client(_SDKS["anthropic"])()
    await lean.aclose()
    with pytest.raises(RuntimeError, match="client has been closed"):
        await lean.post("http://127.0.0.1:1/json", content=b"{}")


@pytest.mark.parametrize("content_type", [b"text/event-stream; charset=utf-8", b"application/json"])
@pytest.mark.parametrize("sdk", sorted(_SDKS))
async def test_a_streamed_answer_is_read_as_it_arrives(sdk: str, content_type: bytes) -> None:
    """The first event reaches the reader while the server still holds the rest back (a body read
    whole would wait for the end, and the server waits for the reader), whatever its type says."""
    first_read = threading.Event()

    def stream(_path: bytes, conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: " + content_type + b"\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + _chunk(b"data: first\n\n")
        )
        first_read.wait(10)
        conn.sendall(_chunk(b"data: last\n\n") + b"0\r\n\r\n")

    _, lean = _clients(sdk)
    try:
        with _server(stream) as url:
            request = lean.build_request("POST", f"{url}/stream", content=b"{}")
            response = await lean.send(request, stream=True)
            chunks = []
            async with asyncio.timeout(5):
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
                    first_read.set()
            await response.aclose()
        assert chunks[0] == b"data: first\n\n" and b"".join(chunks) == b"data: first\n\ndata: last\n\n"
    finally:
        await lean.aclose()


@pytest.mark.parametrize("sdk", sorted(_SDKS))
async def test_failures_raise_the_sdks_own_exceptions(sdk: str) -> None:
    """A refused connection and a body cut short raise what the SDK's transport raises (the two
    SDKs map aiohttp's exceptions differently)."""
    stock, lean = _clients(sdk)
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    try:
        raised = []
        for client in (stock, lean):
            with pytest.raises(httpx2.HTTPError) as refused:
                await client.post(f"http://127.0.0.1:{port}/json", content=b"{}")
            with _server() as url, pytest.raises(httpx2.HTTPError) as cut:
                await client.post(f"{url}/broken", content=b"{}")
            # The error names its request, as httpx's `request_context` makes it.
            assert refused.value.request.url.port == port and cut.value.request.url.path == "/broken"
            raised.append((type(refused.value), type(cut.value)))
        assert raised[0] == raised[1]
    finally:
        await stock.aclose()
        await lean.aclose()


def test_a_transport_that_is_not_the_sdks_own_is_left_as_it_is() -> None:
    class Mine(httpx2.AsyncBaseTransport):
        pass

    mine = Mine()
    assert lean_transport(mine) is mine and type(mine) is Mine


@pytest.mark.parametrize("sdk", sorted(_SDKS))
async def test_a_read_timeout_is_the_sdk_transports_own(sdk: str) -> None:
    """An answer that stalls after its headers, or before them, past the read timeout raises
    what the SDK's transport raises, after about that timeout (the timeout is the request's)."""
    release = threading.Event()

    def stall(path: bytes, conn: socket.socket) -> None:
        if path == b"/after-headers":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n{")
        release.wait(10)

    stock, lean = _clients(sdk)
    try:
        with _server(stall) as url:
            for path in ("/after-headers", "/before-headers"):
                raised = []
                for client in (stock, lean):
                    started = asyncio.get_running_loop().time()
                    with pytest.raises(httpx2.TimeoutException) as timed_out:
                        await client.post(
                            f"{url}{path}", content=b"{}", timeout=httpx2.Timeout(5.0, read=0.3)
                        )
                    took = asyncio.get_running_loop().time() - started
                    raised.append(type(timed_out.value))
                    assert 0.25 < took < 3, (path, took)
                assert raised[0] is raised[1], path
    finally:
        release.set()
        await stock.aclose()
        await lean.aclose()
