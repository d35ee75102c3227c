"""toolChoice and compat-server capabilities through the real SDKs against the loopback fake.

The fake's `llamacpp` dialect answers what llama-cpp-python's server cannot take the way that
server does (HTTP 500, a pydantic validation message), so the capabilities of docs/providers.md
are checked here without the real server; tests/interop/ checks them against the real one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import openai
import pytest
import structlog

from stevora.errors import ProviderError
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.capabilities import ServerCapabilities
from stevora.llm.messages import LlmRequest, Message, NamedTool, ToolCall, ToolSpec
from stevora.llm.openai_provider import OpenAIProvider, http_client
from stevora.llm.setup import build_router
from stevora.settings import Settings
from stevora.testing.fake_llm import FakeLLMServer, error, openai_text, scripted_responder

WEATHER = ToolSpec("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}})
TIME = ToolSpec("get_time", "Time", {"type": "object", "properties": {}})
TOOL_ROUND = [
    Message.user("Weather in Paris?"),
    Message.assistant(None, [ToolCall("call_1", "get_weather", '{"city":"Paris"}')]),
    Message.tool_result("call_1", '{"temp_c":21}'),
]

CompatFactory = Callable[..., OpenAIProvider]


@pytest.fixture(scope="module")
def llamacpp_fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(openai_dialect="llamacpp") as server:
        yield server


@pytest.fixture
async def make_compat(llamacpp_fake: FakeLLMServer) -> AsyncIterator[CompatFactory]:
    """A compat provider on an SDK client with the production HTTP client (and its hook)."""
    llamacpp_fake.reset()
    clients: list[openai.AsyncOpenAI] = []

    def make(capabilities: ServerCapabilities | None = None, *, max_retries: int = 2) -> OpenAIProvider:
        client = openai.AsyncOpenAI(
            api_key="not-needed",
            base_url=llamacpp_fake.openai_base_url,
            max_retries=max_retries,
            timeout=10.0,
            http_client=http_client(),
            _strict_response_validation=True,
        )
        clients.append(client)
        return OpenAIProvider("x", name="llamacpp", client=client, capabilities=capabilities)

    yield make
    for client in clients:
        await client.close()


async def test_openai_named_tool_choice_reaches_the_api_and_only_that_tool_is_called(
    fake_llm: FakeLLMServer, make_openai: Callable[..., OpenAIProvider]
) -> None:
    fake_llm.openai.responder = scripted_responder("openai")
    request = LlmRequest(
        model="gpt-4o-mini",
        messages=[Message.user("time?")],
        tools=[WEATHER, TIME],
        tool_choice=NamedTool("get_time"),
    )
    response = await make_openai().complete(request)

    assert [call.name for call in response.tool_calls] == ["get_time"]
    sent = fake_llm.openai.requests[0].json
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}


async def test_anthropic_none_and_disabled_parallel_use_reach_the_api(
    fake_llm: FakeLLMServer, make_anthropic: Callable[..., AnthropicProvider]
) -> None:
    fake_llm.anthropic.responder = scripted_responder("anthropic")
    provider = make_anthropic()
    none = await provider.complete(
        LlmRequest(
            model="claude-haiku-4-5", messages=[Message.user("hi")], tools=[WEATHER], tool_choice="none"
        )
    )
    forced = await provider.complete(
        LlmRequest(
            model="claude-haiku-4-5",
            messages=[Message.user("hi")],
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
        )
    )

    assert none.tool_calls == [] and none.text
    assert forced.tool_calls
    sent = [r.json["tool_choice"] for r in fake_llm.anthropic.requests]
    assert sent == [{"type": "none"}, {"type": "any", "disable_parallel_tool_use": True}]


async def test_fakes_reject_a_named_choice_that_is_not_among_the_tools(
    fake_llm: FakeLLMServer,
    make_openai: Callable[..., OpenAIProvider],
    make_anthropic: Callable[..., AnthropicProvider],
) -> None:
    for provider, model in ((make_openai(), "gpt-4o-mini"), (make_anthropic(), "claude-haiku-4-5")):
        request = LlmRequest(
            model=model, messages=[Message.user("x")], tools=[WEATHER], tool_choice=NamedTool("nope")
        )
        with pytest.raises(ProviderError) as info:
            await provider.complete(request)
        assert info.value.status_code == 400 and not info.value.retryable
        assert "nope" in str(info.value)


async def test_a_tool_round_on_a_llamacpp_like_server_is_accepted_with_the_default_capabilities(
    llamacpp_fake: FakeLLMServer, make_compat: CompatFactory
) -> None:
    llamacpp_fake.openai.enqueue(openai_text("It is 21 degrees in Paris."))
    response = await make_compat().complete(LlmRequest(model="smollm2", messages=TOOL_ROUND, tools=[WEATHER]))

    assert response.text == "It is 21 degrees in Paris."
    sent = llamacpp_fake.openai.requests[0].json
    assert sent["messages"][1]["content"] == ""
    assert "parallel_tool_calls" not in sent


async def test_null_content_on_a_llamacpp_like_server_fails_once_without_burning_retries(
    llamacpp_fake: FakeLLMServer, make_compat: CompatFactory
) -> None:
    provider = make_compat(ServerCapabilities(tool_call_content="null"), max_retries=2)
    with pytest.raises(ProviderError) as info:
        await provider.complete(LlmRequest(model="smollm2", messages=TOOL_ROUND, tools=[WEATHER]))

    assert info.value.status_code == 500
    assert info.value.retryable is False  # the step does not spend its retry budget on it
    assert "validation errors" in str(info.value)
    assert len(llamacpp_fake.openai.requests) == 1  # and the SDK did not resend it twice


async def test_a_plain_server_error_is_still_retried(
    llamacpp_fake: FakeLLMServer, make_compat: CompatFactory
) -> None:
    llamacpp_fake.openai.enqueue(error(500, "model crashed", retry_after_ms=1), openai_text("ok"))
    response = await make_compat(max_retries=2).complete(
        LlmRequest(model="smollm2", messages=[Message.user("hi")])
    )

    assert response.text == "ok"
    assert len(llamacpp_fake.openai.requests) == 2


async def test_required_on_a_llamacpp_like_server_is_sent_as_the_named_form_of_its_one_tool(
    llamacpp_fake: FakeLLMServer, make_compat: CompatFactory
) -> None:
    llamacpp_fake.openai.responder = scripted_responder("openai")
    response = await make_compat().complete(
        LlmRequest(
            model="smollm2", messages=[Message.user("weather")], tools=[WEATHER], tool_choice="required"
        )
    )
    assert [call.name for call in response.tool_calls] == ["get_weather"]
    assert llamacpp_fake.openai.requests[0].json["tool_choice"]["function"] == {"name": "get_weather"}


async def test_a_server_that_omits_usage_is_logged_once_and_counts_zero(
    llamacpp_fake: FakeLLMServer, make_compat: CompatFactory
) -> None:
    answer = openai_text("hi")
    assert answer.body is not None
    del answer.body["usage"]
    llamacpp_fake.openai.enqueue(answer, openai_text("again"))
    provider = make_compat()
    with structlog.testing.capture_logs() as logs:
        first = await provider.complete(LlmRequest(model="smollm2", messages=[Message.user("hi")]))
        await provider.complete(LlmRequest(model="smollm2", messages=[Message.user("hi")]))

    assert first.usage.total_tokens == 0
    assert [entry["event"] for entry in logs].count("llm_usage_missing") == 1


async def test_build_router_gives_each_compat_server_its_configured_capabilities() -> None:
    settings = Settings(
        compat_base_urls={"vllm": "http://127.0.0.1:9/v1", "llamacpp": "http://127.0.0.1:9/v1"},
        compat_capabilities={"vllm": ServerCapabilities(tool_choice=frozenset({"required"}), send_auto=True)},
    )
    router = build_router(settings)
    try:
        vllm, llamacpp = router.get("vllm"), router.get("llamacpp")
        assert isinstance(vllm, OpenAIProvider) and isinstance(llamacpp, OpenAIProvider)
        assert vllm.capabilities.send_auto and vllm.capabilities.tool_choice == {"required"}
        assert llamacpp.capabilities == ServerCapabilities()
    finally:
        await router.aclose()
