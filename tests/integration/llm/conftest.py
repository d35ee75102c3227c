"""A loopback fake of both provider APIs, and provider adapters wired to it with real SDK clients.

Every client validates responses strictly, so a fake body the real SDK would not accept fails
the test instead of silently turning into `None` fields.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import anthropic
import openai
import pytest

from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.openai_provider import OpenAIProvider
from stevora.testing.fake_llm import FakeLLMServer


@pytest.fixture(scope="session")
def fake_llm_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def fake_llm(fake_llm_server: FakeLLMServer) -> Iterator[FakeLLMServer]:
    fake_llm_server.reset()
    yield fake_llm_server
    fake_llm_server.reset()


@pytest.fixture
async def make_openai(fake_llm: FakeLLMServer) -> AsyncIterator[Callable[..., OpenAIProvider]]:
    clients: list[openai.AsyncOpenAI] = []

    def make(*, max_retries: int = 0, timeout_s: float = 10.0, name: str = "openai") -> OpenAIProvider:
        client = openai.AsyncOpenAI(
            api_key="test",
            base_url=fake_llm.openai_base_url,
            max_retries=max_retries,
            timeout=timeout_s,
            _strict_response_validation=True,
        )
        clients.append(client)
        return OpenAIProvider("test", name=name, client=client)

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def make_anthropic(fake_llm: FakeLLMServer) -> AsyncIterator[Callable[..., AnthropicProvider]]:
    clients: list[anthropic.AsyncAnthropic] = []

    def make(*, max_retries: int = 0, timeout_s: float = 10.0) -> AnthropicProvider:
        client = anthropic.AsyncAnthropic(
            api_key="test",
            base_url=fake_llm.anthropic_base_url,
            max_retries=max_retries,
            timeout=timeout_s,
            open_telemetry=False,
            _strict_response_validation=True,
        )
        clients.append(client)
        return AnthropicProvider("test", client=client)

    yield make
    for client in clients:
        await client.close()
