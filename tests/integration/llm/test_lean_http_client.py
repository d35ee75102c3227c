"""`LeanRequests` (stevora.llm.provider): the SDKs' HTTP clients as Stevora builds them merge the
same headers once instead of on every call, and still put on the wire exactly what the stock
client puts there, for both SDKs on both HTTP stacks: the request line, every header (order and
values, `x-stainless-retry-count` of each retry included), the body, and the cookies a server set."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import anthropic
import httpx2
import openai
import pytest

import stevora.llm.anthropic_provider as anthropic_provider
import stevora.llm.openai_provider as openai_provider
import stevora.llm.openai_responses as openai_responses
import stevora.llm.provider as provider_module
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.messages import LlmRequest, Message, ToolCall, ToolSpec
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.provider import HttpStack, LeanRequests
from stevora.testing.fake_llm import anthropic_text, openai_text
from tests.integration.llm.raw_http import raw_http_server

_CHAT = openai_text("hi").body
_MESSAGE = anthropic_text("hi").body


# What the server answers, in turn: a 500 and a 429 (each retried by the SDK), a redirect setting
# a cookie (followed by httpx, as the SDKs' clients are set to), then 200s (the second call must
# carry the cookie back).
_SCRIPT = [
    (500, [b"retry-after-ms: 1"]),
    (429, [b"retry-after-ms: 1"]),
    (307, [b"location: ?moved=1", b"set-cookie: session=abc; Path=/"]),
]


@contextmanager
def _recording_server() -> Iterator[tuple[str, list[bytes]]]:
    """A keep-alive HTTP/1.1 server on a raw socket that records every request as its bytes
    arrived (request line, headers in order, body) and answers by `_SCRIPT`."""
    seen: list[bytes] = []

    def answer(head: bytes, body: bytes, conn: socket.socket) -> bool:
        seen.append(head + b"\r\n\r\n" + body)
        status, extra = _SCRIPT[len(seen) - 1] if len(seen) <= len(_SCRIPT) else (200, [])
        text = json.dumps(
            (_MESSAGE if b"/v1/messages" in head.split(b"\r\n", 1)[0] else _CHAT)
            if status == 200
            else {"error": {"message": "again", "type": "overloaded"}}
        ).encode()
        lines = [f"HTTP/1.1 {status} X".encode(), b"content-type: application/json", *extra]
        lines.append(f"content-length: {len(text)}".encode())
        conn.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + text)
        return True

    with raw_http_server(answer) as url:
        yield url, seen


def _provider(kind: str, base_url: str, http: HttpStack) -> OpenAIProvider | AnthropicProvider:
    if kind == "anthropic":
        return AnthropicProvider("k", base_url, max_retries=2, max_connections=4, http=http, stream=False)
    return OpenAIProvider("k", f"{base_url}/v1", max_retries=2, max_connections=4, http=http, stream=False)


async def _sent(kind: str, http: HttpStack) -> tuple[list[bytes], httpx2.AsyncClient]:
    request = LlmRequest(
        model="m",
        messages=[
            Message.user("Weather in Paris?"),
            Message.assistant(tool_calls=[ToolCall("call_1", "weather", '{"city": "Paris"}')]),
            Message.tool_result("call_1", '{"temp": 21}'),
        ],
        tools=[ToolSpec("weather", "The weather", {"type": "object", "properties": {}})],
        timeout_s=30.0,
    )
    with _recording_server() as (url, seen):
        provider = _provider(kind, url, http)
        try:
            for _ in range(2):
                assert (await provider.complete(request)).text == "hi"
        finally:
            await provider.aclose()
    host = url.split("//", 1)[1].encode()
    return [r.replace(host, b"HOST") for r in seen], provider.client._client  # each run its own port


@pytest.mark.parametrize("http", ["aiohttp", "httpx"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_the_requests_on_the_wire_are_the_stock_clients_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, kind: str, http: HttpStack
) -> None:
    lean, lean_client = await _sent(kind, http)
    monkeypatch.setattr(provider_module, "lean_client", lambda cls: cls)
    stock, stock_client = await _sent(kind, http)
    assert isinstance(lean_client, LeanRequests) and not isinstance(stock_client, LeanRequests)
    assert len(lean) == 5  # two retries, the redirect followed, then the second call
    assert lean == stock, [(a, b) for a, b in zip(lean, stock, strict=True) if a != b][:1]
    heads = [r.split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n") for r in lean]
    assert [h for head in heads for h in head if h.startswith(b"x-stainless-retry-count")] == [
        b"x-stainless-retry-count: 0",
        b"x-stainless-retry-count: 1",
        b"x-stainless-retry-count: 2",
        b"x-stainless-retry-count: 2",
        b"x-stainless-retry-count: 0",
    ]
    assert heads[3][0].startswith(b"post /v1/") and b"?moved=1 " in heads[3][0]
    assert b"cookie: session=abc" in heads[4] and not any(b"cookie: session=abc" in h for h in heads[:3])


@pytest.mark.parametrize("http", ["aiohttp", "httpx"])
async def test_the_anthropic_adapter_sends_what_the_stock_sdk_client_sends_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, http: HttpStack
) -> None:
    """Everything the adapter's request path keeps (`_AnthropicClient`'s URLs and headers,
    `_request_options`, `LeanRequests`) against the SDK's own `AsyncAnthropic.post` on its stock
    HTTP client: the same bytes, its `User-Agent` and each retry's headers included."""
    lean, lean_client = await _sent("anthropic", http)
    monkeypatch.setattr(provider_module, "lean_client", lambda cls: cls)
    monkeypatch.setattr(anthropic_provider, "_AnthropicClient", anthropic.AsyncAnthropic)
    monkeypatch.setattr(anthropic_provider, "_request_options", lambda *_: None)
    stock, stock_client = await _sent("anthropic", http)
    assert isinstance(lean_client, LeanRequests) and not isinstance(stock_client, LeanRequests)
    assert len(lean) == 5
    assert lean == stock, [(a, b) for a, b in zip(lean, stock, strict=True) if a != b][:1]
    assert b"\r\nuser-agent: asyncanthropic/python " in lean[0].lower()


@pytest.mark.parametrize("http", ["aiohttp", "httpx"])
async def test_the_openai_adapter_sends_what_the_stock_sdk_client_sends_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, http: HttpStack
) -> None:
    """Everything the OpenAI adapter's request path keeps (`_OpenAIClient`'s URLs and headers,
    `openai_responses._request_options`, `LeanRequests`) against the SDK's own `AsyncOpenAI.post`
    on its stock HTTP client: the same bytes, its `User-Agent` and each retry's headers included."""
    lean, lean_client = await _sent("openai", http)
    monkeypatch.setattr(provider_module, "lean_client", lambda cls: cls)
    monkeypatch.setattr(openai_provider, "_OpenAIClient", openai.AsyncOpenAI)
    monkeypatch.setattr(openai_responses, "_request_options", lambda *_: None)

    def sdk_encodes(*_: object) -> bytes:
        raise TypeError("the stock leg: the SDK encodes the body itself")

    monkeypatch.setattr(openai_responses, "body_json", sdk_encodes)
    stock, stock_client = await _sent("openai", http)
    assert isinstance(lean_client, LeanRequests) and not isinstance(stock_client, LeanRequests)
    assert len(lean) == 5
    assert lean == stock, [(a, b) for a, b in zip(lean, stock, strict=True) if a != b][:1]


@pytest.mark.parametrize("http", ["aiohttp", "httpx"])
async def test_the_openai_adapter_sends_the_sdks_own_user_agent(http: HttpStack) -> None:
    """The SDK names its `User-Agent` after its client class: the adapter's subclass
    (`_OpenAIClient`) must still send `AsyncOpenAI/Python <version>`, as the stock client does."""
    lean, _ = await _sent("openai", http)
    assert f"\r\nuser-agent: asyncopenai/python {openai.__version__}\r\n".encode() in lean[0].lower()


async def test_a_lean_requests_headers_give_their_text_without_decoding_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The aiohttp transport reads every request's headers as text (`items()`): a lean request
    has it, and its encoding, from when it was built; changed, its headers are httpx's own."""
    async with provider_module.lean_client(httpx2.AsyncClient)(headers={"x-a": "1"}) as lean:
        async with httpx2.AsyncClient(headers={"x-a": "1"}) as stock:
            headers = httpx2.Headers({"x-b": "é", "x-c": "2"}, encoding="utf-8")
            ours = lean.build_request("POST", "http://h.test/v1/x", content=b"{}", headers=headers)
            theirs = stock.build_request("POST", "http://h.test/v1/x", content=b"{}", headers=headers)
            assert ours.headers._encoding == "utf-8" and theirs.headers._encoding is None
            assert ours.headers.encoding == theirs.headers.encoding
            stock_items = httpx2.Headers.items
            assert list(ours.headers.items()) == list(stock_items(theirs.headers))
            with monkeypatch.context() as patched:
                patched.setattr(httpx2.Headers, "items", lambda self: pytest.fail("decoded again"))
                assert dict(ours.headers.items())["x-b"] == "é"
            ours.headers.encoding = theirs.headers.encoding = "latin-1"  # read again in the new one
            assert dict(ours.headers.items())["x-b"] == dict(stock_items(theirs.headers))["x-b"] == "Ã©"
            ours.headers["x-c"] = "3"
            theirs.headers["x-c"] = "3"
            assert list(ours.headers.items()) == list(theirs.headers.items())
            assert ours.headers.copy().raw == theirs.headers.copy().raw


async def test_a_request_the_sdks_do_not_build_goes_through_the_stock_build_request() -> None:
    """The SDKs' requests (a URL or its text, `Headers` or a list of pairs) are built as httpx
    builds them; query params, JSON, cookies given, extensions, an empty body, headers that are
    not pairs of text: httpx's own `build_request`."""
    base = "http://base.test/api/"
    async with provider_module.lean_client(httpx2.AsyncClient)(headers={"x-a": "1"}, base_url=base) as lean:
        async with httpx2.AsyncClient(headers={"x-a": "1"}, base_url=base) as stock:
            url = httpx2.URL("http://example.test/v1/x")
            for options in (
                {"params": {"q": "1"}, "content": b"{}"},
                {"json": {"a": 1}},
                {"cookies": {"c": "1"}, "content": b"{}"},
                {"extensions": {"sni_hostname": "h"}, "content": b"{}"},
                {"content": b""},
                {"content": b"{}", "headers": httpx2.Headers({"Host": "other.test", "x-b": "2"})},
                {"content": b"{}", "headers": httpx2.Headers({"x-b": "2"}), "timeout": 3.0},
                {"content": b"{}", "headers": httpx2.Headers({"x-a": "3", "x-b": "2"})},
                {"content": b"{}", "headers": [("x-b", "2"), ("X-A", "3"), ("x-b", "4")]},
                {"content": b"{}", "headers": [("x-b", ["not", "text"])]},
            ):
                for target in (url, str(url), str(url), "v1/y"):  # text twice: the second is kept
                    try:
                        theirs = stock.build_request("POST", target, **options)  # type: ignore[arg-type]
                    except TypeError:
                        with pytest.raises(TypeError):
                            lean.build_request("POST", target, **options)  # type: ignore[arg-type]
                        continue
                    ours = lean.build_request("POST", target, **options)  # type: ignore[arg-type]
                    assert ours.headers.raw == theirs.headers.raw
                    assert ours.headers.encoding == theirs.headers.encoding
                    assert list(ours.headers.items()) == list(theirs.headers.items())
                    assert (ours.method, ours.url) == (theirs.method, theirs.url)
                    assert ours.extensions == theirs.extensions
                    assert ours.read() == theirs.read()


async def test_an_azure_client_gets_its_body_as_a_dict_and_its_deployments_url() -> None:
    """A client that builds its requests its own way (`AsyncAzureOpenAI` reads the body's model
    for the URL) is given the body as the dict `create` gives it, not as bytes."""
    with _recording_server() as (url, seen):
        client = openai.AsyncAzureOpenAI(
            api_key="k", azure_endpoint=url, api_version="2024-10-21", max_retries=3
        )
        provider = OpenAIProvider("k", client=client, stream=False)
        request = LlmRequest(model="dep1", messages=[Message.user("hi")])
        try:
            await provider.complete(request)
            await client.chat.completions.create(model="dep1", messages=[{"role": "user", "content": "hi"}])
        finally:
            await client.close()
    ours, theirs = (r.split(b"\r\n", 1)[0] for r in (seen[0], seen[4]))  # each one's first request
    assert ours == theirs and b"/openai/deployments/dep1/chat/completions?api-version=2024-10-21" in ours
