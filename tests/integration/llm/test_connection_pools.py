"""Providers built from settings hold `STEVORA_PROVIDER_MAX_CONNECTIONS` connections (default: the
worker's `STEVORA_MAX_CONCURRENT_RUNS`) in small pools: every run in flight has its call out at
once, and connections are kept alive and reused instead of opened per call."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stevora.llm.messages import LlmRequest, Message
from stevora.llm.provider import SHARD_CONNECTIONS, ShardedTransport
from stevora.llm.setup import build_router
from stevora.settings import Settings
from stevora.testing.fake_llm import FakeLLMServer, scripted_responder


@pytest.fixture
def server() -> object:
    with FakeLLMServer() as fake:
        yield fake


@pytest.mark.parametrize("http", ["aiohttp", "httpx"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_more_calls_than_one_pool_holds_go_out_at_once_and_their_connections_stay(
    server: FakeLLMServer, kind: str, http: str
) -> None:
    in_flight = 3 * SHARD_CONNECTIONS + 5
    settings = Settings(
        openai_api_key="k",
        openai_base_url=server.openai_base_url,
        anthropic_api_key="k",
        anthropic_base_url=server.anthropic_base_url,
        max_concurrent_runs=in_flight,
        llm_stream=False,
        provider_http=http,
    )
    provider = build_router(settings).get(kind)
    assert provider is not None
    transport = provider.client._client._transport  # type: ignore[attr-defined]
    if http == "httpx":
        assert isinstance(transport, ShardedTransport) and len(transport._shards) == 4
    else:  # one aiohttp pool of that many connections, every one kept alive
        # The SDK's own transport, under the lean subclass (stevora/llm/lean_aiohttp.py).
        assert [c.__name__ for c in type(transport).__mro__[:3]] == [
            "LeanAiohttpTransport",
            "_LeanAiohttp",
            "AiohttpTransport",
        ]
        assert transport.limits.max_connections == transport.limits.max_keepalive_connections == in_flight
    request = LlmRequest(
        model="gpt-4o-mini" if kind == "openai" else "claude-haiku-4-5", messages=[Message.user("hi")]
    )
    answer = scripted_responder(kind)
    # Every call of a wave must be at the server at once for any of them to be answered.
    together = threading.Barrier(in_flight, timeout=60)

    def all_at_once(body: dict) -> object:
        together.wait()
        return answer(body)

    getattr(server, kind).responder = all_at_once
    try:
        # (The SDKs' own pool held 1,000 calls out at once; past that, calls waited in it.)
        await asyncio.gather(*(provider.complete(request) for _ in range(in_flight)))
        assert len(set(server.client_ports)) == in_flight
        if http == "httpx":
            assert transport._busy == [0, 0, 0, 0]  # every answer read gave its connection back
        else:
            assert transport.client.connector.limit == in_flight
        # A second wave and then calls one at a time reuse those connections: none is opened.
        await asyncio.gather(*(provider.complete(request) for _ in range(in_flight)))
        getattr(server, kind).responder = answer
        for _ in range(3):
            await provider.complete(request)
        assert len(set(server.client_ports)) == in_flight
        assert len(server.client_ports) == 2 * in_flight + 3
        # One at a time, httpx's first pool serves: the same connection each time (aiohttp takes
        # the longest idle connection first, and closes those idle past the keep-alive expiry).
        assert len(set(server.client_ports[-3:])) == (1 if http == "httpx" else 3)
    finally:
        await provider.aclose()  # type: ignore[attr-defined]


def test_the_connections_follow_the_settings() -> None:
    assert Settings(max_concurrent_runs=300).call_options().max_connections == 300
    assert Settings(max_concurrent_runs=300, provider_max_connections=50).call_options().max_connections == 50
    transport = ShardedTransport(100)
    assert len(transport._shards) * transport._per >= 100 and transport._per <= SHARD_CONNECTIONS


async def test_without_aiohttp_the_provider_clients_fall_back_to_httpx_with_the_same_hooks() -> None:
    from stevora.llm.provider import leave_429_to_the_limiter, sdk_http_client

    def missing(**_: object) -> object:
        raise RuntimeError(
            "To use the aiohttp client you must have installed the package with the `aiohttp` extra"
        )

    import openai

    client = sdk_http_client(openai.DefaultAsyncHttpxClient, missing, [leave_429_to_the_limiter], 40)  # type: ignore[arg-type]
    try:
        assert isinstance(client._transport, ShardedTransport) and len(client._transport._shards) == 2
        assert client.event_hooks["response"] == [leave_429_to_the_limiter]
    finally:
        await client.aclose()
    aio = sdk_http_client(
        openai.DefaultAsyncHttpxClient, openai.DefaultAioHttpClient, [leave_429_to_the_limiter], 40
    )
    try:
        assert (
            type(aio._transport).__name__ == "LeanAiohttpTransport"
            and aio._transport.limits.max_connections == 40  # type: ignore[attr-defined]
        )
        assert aio.event_hooks["response"] == [leave_429_to_the_limiter]
    finally:
        await aio.aclose()
