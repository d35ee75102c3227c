"""What both HTTP stacks under the provider SDKs (`STEVORA_PROVIDER_HTTP`: aiohttp, httpx) do alike:
the environment's proxies are honoured (docs/configuration.md), and the step's timeout bounds the
whole call, the request's body sent included."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stevora.errors import ProviderError
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.messages import LlmRequest, Message
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.provider import HttpStack

_CHAT = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "by proxy"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
_MESSAGE = {
    "id": "msg",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "by proxy"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


@contextmanager
def _answering_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server answering every POST itself (as a proxy would relay the upstream answer),
    recording the request target: an absolute URL when the request came through it as a proxy."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append(self.path)
            body = json.dumps(_MESSAGE if self.path.endswith("/messages") else _CHAT).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def _clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def _provider(
    kind: str, base_url: str, http: HttpStack, **options: object
) -> OpenAIProvider | AnthropicProvider:
    if kind == "anthropic":
        return AnthropicProvider("k", base_url, max_retries=0, max_connections=4, http=http, **options)  # type: ignore[arg-type]
    return OpenAIProvider("k", f"{base_url}/v1", max_retries=0, max_connections=4, http=http, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("http", ["aiohttp", "httpx"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("variable", ["HTTP_PROXY", "ALL_PROXY"])
async def test_both_stacks_send_through_the_environments_proxy(
    monkeypatch: pytest.MonkeyPatch, kind: str, http: HttpStack, variable: str
) -> None:
    _clear_proxies(monkeypatch)
    with _answering_server() as (proxy, through_proxy):
        monkeypatch.setenv(variable, proxy)
        # A host that does not resolve: only the proxy can answer for it.
        provider = _provider(kind, "http://llm.stevora-test.invalid", http, stream=False)
        try:
            answer = await provider.complete(LlmRequest(model="m", messages=[Message.user("hi")]))
        finally:
            await provider.aclose()
    assert answer.text == "by proxy"
    path = "/v1/messages" if kind == "anthropic" else "/v1/chat/completions"
    assert through_proxy == [f"http://llm.stevora-test.invalid{path}"]  # absolute-form: a proxied request


@pytest.mark.parametrize("http", ["aiohttp", "httpx"])
async def test_both_stacks_go_direct_to_a_host_in_no_proxy(
    monkeypatch: pytest.MonkeyPatch, http: HttpStack
) -> None:
    _clear_proxies(monkeypatch)
    with _answering_server() as (proxy, through_proxy), _answering_server() as (upstream, direct):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        provider = _provider("openai", upstream, http, stream=False)
        try:
            answer = await provider.complete(LlmRequest(model="m", messages=[Message.user("hi")]))
        finally:
            await provider.aclose()
    assert answer.text == "by proxy"
    assert through_proxy == [] and direct == ["/v1/chat/completions"]


@contextmanager
def _deaf_server() -> Iterator[str]:
    """A server that accepts connections and never reads from them nor answers: a request body
    larger than the socket buffers cannot be sent in full."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


# aiohttp warns about any bytes body over 1 MB; this one is that large on purpose.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
@pytest.mark.parametrize("http", ["aiohttp", "httpx"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
@pytest.mark.parametrize("kind", ["openai-chat", "openai-responses", "anthropic"])
async def test_the_steps_timeout_bounds_sending_a_body_the_server_never_reads(
    kind: str, stream: bool, http: HttpStack
) -> None:
    # ~32 MB of prompt: far more than the loopback socket buffers hold.
    big = Message.user("x" * (32 * 1024 * 1024))
    request = LlmRequest(
        model="m",
        messages=[big],
        timeout_s=0.5,
        api="responses" if kind == "openai-responses" else None,
    )
    with _deaf_server() as url:
        # The client's own timeout is long: only the step's timeout can end the call in time.
        provider = (
            AnthropicProvider("k", url, max_retries=0, stream=stream, http=http, timeout_s=600.0)
            if kind == "anthropic"
            else OpenAIProvider("k", f"{url}/v1", max_retries=0, stream=stream, http=http, timeout_s=600.0)
        )
        started = time.perf_counter()
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(request)
        finally:
            await provider.aclose()
    elapsed = time.perf_counter() - started
    assert caught.value.retryable and "timed out" in caught.value.message
    assert elapsed < 0.5 + 2.0
