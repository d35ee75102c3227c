"""The OpenAI adapter's request path kept lean, as Anthropic's (docs/benchmarks.md, "The real path,
counted"): the SDK's request options built once per path and timeout (`openai_responses.
_request_options`) and its headers once per value of what they are built from
(`_OpenAIClient._build_headers`), on Chat Completions and on the Responses API, while every request
still carries what the SDK's typed `create` sends and nothing kept from an earlier one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import openai
import pytest
from openai._models import FinalRequestOptions

from stevora.llm import openai_responses
from stevora.llm.messages import LlmRequest, Message, ToolSpec
from stevora.llm.openai_provider import OpenAIProvider, _OpenAIClient
from stevora.testing.fake_llm import FakeLLMServer, ProviderScript, error, openai_text
from stevora.testing.fake_responses import responses_text

WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def _request(api: str, text: str = "weather in Paris?", **kwargs: Any) -> LlmRequest:
    return LlmRequest(
        model="gpt-4o-mini",
        messages=[Message.system("Be terse."), Message.user(text)],
        tools=[WEATHER],
        temperature=0.3,
        max_tokens=50,
        cache_key="run_1",
        api=api,  # type: ignore[arg-type]
        **kwargs,
    )


def _script(fake_llm: FakeLLMServer, api: str) -> ProviderScript:
    return fake_llm.openai if api == "chat" else fake_llm.responses


def _answer(api: str) -> Any:
    return openai_text("a") if api == "chat" else responses_text("a")


@pytest.fixture
async def make_provider(fake_llm: FakeLLMServer) -> AsyncIterator[Callable[..., OpenAIProvider]]:
    """The adapter with its own client (`_OpenAIClient`), as a worker builds it."""
    made: list[OpenAIProvider] = []

    def make(**kwargs: Any) -> OpenAIProvider:
        kwargs.setdefault("max_retries", 0)
        provider = OpenAIProvider("test", fake_llm.openai_base_url, **kwargs)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        await provider.aclose()


async def _typed_create(provider: OpenAIProvider, request: LlmRequest, *, stream: bool) -> None:
    """The same call through the SDK's typed `create`, on the adapter's own client."""
    if request.api == "chat":
        kwargs = provider.build_kwargs(request)
        if stream:
            kwargs.update(stream=True, stream_options={"include_usage": True})
        answer: Any = await provider.client.chat.completions.create(**kwargs)
    else:
        kwargs = openai_responses.build_kwargs(request, provider.structured_plan(request))
        if stream:
            kwargs["stream"] = True
        answer = await provider.client.responses.create(**kwargs)
    if stream:
        async for _ in answer:
            pass


@pytest.mark.parametrize("timeout_s", [None, 9.0])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_the_headers_and_body_sent_are_those_of_the_sdks_typed_create(
    fake_llm: FakeLLMServer,
    make_provider: Callable[..., OpenAIProvider],
    api: str,
    stream: bool,
    timeout_s: float | None,
) -> None:
    """Two calls (the second from the kept options and headers) and then the SDK's typed `create`
    on the same client: the same headers, key for key and in order, and the same JSON body."""
    provider = make_provider(stream=stream)
    request = _request(api, timeout_s=timeout_s)
    _script(fake_llm, api).enqueue(*[_answer(api)] * 3)
    for _ in range(2):
        assert (await provider.complete(request)).text == "a"
    await _typed_create(provider, request, stream=stream)
    first, second, typed = _script(fake_llm, api).requests
    for ours in (first, second):
        assert list(ours.headers.items()) == list(typed.headers.items())
        assert ours.json == typed.json
    expected_timeout = "9.0" if timeout_s is not None else "60.0"
    assert typed.headers["x-stainless-read-timeout"] == expected_timeout
    assert typed.headers["authorization"] == "Bearer test"
    assert typed.json.get("stream", False) is stream


async def test_a_changed_retry_count_api_key_or_timeout_is_sent_not_a_kept_one(
    fake_llm: FakeLLMServer, make_provider: Callable[..., OpenAIProvider]
) -> None:
    """The kept headers are keyed by all they are built from: each retry sends its own count, a
    rotated API key and a new timeout are sent at once, and going back finds the first ones."""
    provider = make_provider(max_retries=2, stream=False)
    fake_llm.openai.enqueue(error(500, retry_after_ms=1), error(500, retry_after_ms=1), openai_text("a"))
    await provider.complete(_request("chat"))
    provider.client.api_key = "rotated"
    fake_llm.openai.enqueue(openai_text("a"), openai_text("a"), openai_text("a"))
    await provider.complete(_request("chat"))
    await provider.complete(_request("chat", timeout_s=5))
    provider.client.api_key = "test"
    await provider.complete(_request("chat", timeout_s=5.0))
    sent = [
        (
            r.headers["x-stainless-retry-count"],
            r.headers["authorization"],
            r.headers["x-stainless-read-timeout"],
        )
        for r in fake_llm.openai.requests
    ]
    assert sent == [
        ("0", "Bearer test", "60.0"),
        ("1", "Bearer test", "60.0"),
        ("2", "Bearer test", "60.0"),
        ("0", "Bearer rotated", "60.0"),
        ("0", "Bearer rotated", "5"),  # 5 and 5.0 are equal keys, but not the same header
        ("0", "Bearer test", "5.0"),
    ]


async def test_a_key_from_an_api_key_provider_is_fresh_on_every_request(fake_llm: FakeLLMServer) -> None:
    """An API-key provider is asked again for each request (the SDK's `_prepare_options`): its
    key travels in the request's own headers, which the kept headers are keyed by."""
    keys = iter(["first", "second", "third"])

    async def api_key() -> str:
        return next(keys)

    client = _OpenAIClient(api_key=api_key, base_url=fake_llm.openai_base_url, max_retries=0)
    provider = OpenAIProvider("unused", client=client, stream=False)
    fake_llm.openai.enqueue(*[openai_text("a")] * 3)
    for _ in range(3):
        await provider.complete(_request("chat"))
    await client.close()
    assert [r.headers["authorization"] for r in fake_llm.openai.requests] == [
        "Bearer first",
        "Bearer second",
        "Bearer third",
    ]


async def test_the_sdks_options_and_headers_are_built_once_for_calls_alike(
    fake_llm: FakeLLMServer, make_provider: Callable[..., OpenAIProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`FinalRequestOptions.construct` runs once per path and timeout, and the SDK's headers
    (`_merge_headers`, called once by each `_build_headers`) once per value of what they read,
    not once per call; each call still sends its own body."""
    constructed: list[dict[str, Any]] = []
    merged: list[object] = []
    construct = FinalRequestOptions.construct
    merge_headers = openai._base_client._merge_headers

    def counted_construct(**values: Any) -> FinalRequestOptions:
        constructed.append(values)
        return construct(**values)

    def counted_merge(*mappings: Any) -> Any:
        merged.append(mappings)
        return merge_headers(*mappings)

    monkeypatch.setattr(FinalRequestOptions, "construct", counted_construct)
    monkeypatch.setattr(openai._base_client, "_merge_headers", counted_merge)
    provider = make_provider(stream=False)
    calls = 5
    for api in ("chat", "responses"):
        _script(fake_llm, api).enqueue(*[_answer(api)] * calls)
        for index in range(calls):
            provider.stream = bool(index % 2)  # a stream's options and headers are a plain call's
            await provider.complete(_request(api, f"question {index}", timeout_s=9.0))
    assert [(c["url"], c["timeout"]) for c in constructed] == [
        ("/chat/completions", 9.0),
        ("/responses", 9.0),
    ]
    assert len(merged) == 1
    sent = [r.json["messages"][1]["content"] for r in fake_llm.openai.requests]
    sent += [r.json["input"][1]["content"] for r in fake_llm.responses.requests]
    assert sent == [f"question {index}" for index in range(calls)] * 2


async def test_a_timeout_that_is_not_a_number_or_extra_headers_go_through_the_sdks_post(
    fake_llm: FakeLLMServer, make_provider: Callable[..., OpenAIProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Options the kept ones are not keyed by are built by the SDK's `post`, as `create` would."""
    posted: list[dict[str, Any]] = []
    provider = make_provider(stream=False)
    client = provider.client
    post: Callable[..., Awaitable[Any]] = client.post

    async def spy(path: str, **kwargs: Any) -> Any:
        posted.append(kwargs["options"])
        return await post(path, **kwargs)

    monkeypatch.setattr(client, "post", spy)
    fake_llm.openai.enqueue(openai_text("a"), openai_text("a"))
    kwargs = provider.build_kwargs(_request("chat"))
    await openai_responses.post(
        client, "/chat/completions", {**kwargs, "timeout": openai.Timeout(7.0)}, stream=False
    )
    await openai_responses.post(
        client, "/chat/completions", {**kwargs, "extra_headers": {"x-a": "1"}}, stream=False
    )
    assert [sorted(options) for options in posted] == [["security", "timeout"], ["headers", "security"]]
    first, second = fake_llm.openai.requests
    assert first.headers["x-stainless-read-timeout"] == "7.0" and second.headers["x-a"] == "1"


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_admin_key_alone_is_refused_as_create_refuses_it(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """`create` asks for the API key only (`security={"bearer_auth": True}`): a client with an
    admin key and no API key sends nothing, as `create` would not, rather than the admin key."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = _OpenAIClient(admin_api_key="admin", base_url=fake_llm.openai_base_url, max_retries=0)
    provider = OpenAIProvider("unused", client=client, stream=False)
    request = _request(api)
    with pytest.raises(TypeError, match="Could not resolve authentication method") as ours:
        await provider.complete(request)
    with pytest.raises(TypeError) as typed:
        await _typed_create(provider, request, stream=False)
    await client.close()
    assert str(ours.value) == str(typed.value)
    assert _script(fake_llm, api).requests == []
