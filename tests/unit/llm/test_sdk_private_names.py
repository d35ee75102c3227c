"""The Anthropic adapter reads two private SDK names (`_constants.MODEL_NONSTREAMING_TOKENS`,
`_calculate_nonstreaming_timeout`); pyproject sets no upper bound on the SDK, so an SDK without
them must neither break the import nor a plain call. The adapters' clients override private SDK
methods (`_prepare_url`, `_build_headers`) and build the SDKs' `FinalRequestOptions`, and their HTTP
client does httpx's `send` with its private names (`provider._httpx_send`):
the tests here fail first if an SDK renames them or changes what they read."""

from __future__ import annotations

import subprocess
import sys
import types
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic._models import FinalRequestOptions
from openai._models import FinalRequestOptions as OpenAIRequestOptions

from stevora.llm import openai_responses
from stevora.llm.anthropic_provider import _AnthropicClient, _nonstreaming_timeout, _request_options
from stevora.llm.openai_provider import OpenAIProvider, _OpenAIClient


def test_the_adapter_imports_when_the_sdk_has_no_model_nonstreaming_tokens() -> None:
    code = (
        "import anthropic._constants as constants\n"
        "del constants.MODEL_NONSTREAMING_TOKENS\n"
        "import stevora.llm.anthropic_provider as adapter\n"
        "assert adapter.MODEL_NONSTREAMING_TOKENS == {}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_plain_call_keeps_the_clients_timeout_when_the_sdk_cannot_size_one() -> None:
    kwargs = {"max_tokens": 1024, "model": "claude-haiku-4-5"}
    without = types.SimpleNamespace()  # an SDK client without `_calculate_nonstreaming_timeout`
    assert _nonstreaming_timeout(without, kwargs) is anthropic.NOT_GIVEN  # type: ignore[arg-type]
    client = anthropic.AsyncAnthropic(api_key="k")
    sized = _nonstreaming_timeout(client, kwargs)
    assert sized is not anthropic.NOT_GIVEN and sized.read == 600


@pytest.mark.parametrize(
    ("ours_cls", "stock_cls"),
    [(_AnthropicClient, anthropic.AsyncAnthropic), (_OpenAIClient, openai.AsyncOpenAI)],
)
def test_the_adapters_client_prepares_the_sdks_urls_once_and_follows_a_new_base_url(
    ours_cls: type, stock_cls: type
) -> None:
    """`_AnthropicClient` and `_OpenAIClient` keep the SDK's `_prepare_url` per path (a private
    SDK name: if the SDK drops it, the stock client below fails here first)."""
    ours = ours_cls(api_key="k", base_url="http://a.test/prefix")
    stock = stock_cls(api_key="k", base_url="http://a.test/prefix")
    for path in ("/v1/messages", "v1/messages", "/v1/messages?beta=true", "https://other.test/v1/x"):
        assert ours._prepare_url(path) == stock._prepare_url(path)
        assert ours._prepare_url(path) is ours._prepare_url(path)  # made once
    ours.base_url = stock.base_url = "http://b.test/"  # type: ignore[assignment]
    assert ours._prepare_url("/v1/messages") == stock._prepare_url("/v1/messages")
    assert str(ours._prepare_url("/v1/messages")) == "http://b.test/v1/messages"


def test_the_openai_adapter_builds_its_own_client_with_urls_made_once() -> None:
    assert type(OpenAIProvider("k", "http://a.test/v1").client) is _OpenAIClient
    given = openai.AsyncOpenAI(api_key="k")
    assert OpenAIProvider("k", client=given).client is given


# What the SDK's `BaseClient._build_headers` and `AsyncAnthropic._validate_headers` read: the key
# `_AnthropicClient` keeps their headers by (`_headers_key`) holds all of it. An SDK that reads
# anything else fails here first, and the key must be looked at again.
_BUILD_HEADERS_READS = {
    "isinstance", "timeout", "NotGiven", "Timeout", "read", "_idempotency_header", "idempotency_key",
    "build_headers", "str", "default_headers", "_custom_headers", "headers", "_validate_headers",
}  # fmt: skip
_VALIDATE_HEADERS_READS = {"_token_cache", "get", "TypeError"}


def test_the_sdk_builds_headers_from_what_the_adapters_client_keys_them_by() -> None:
    assert set(anthropic._base_client.BaseClient._build_headers.__code__.co_names) == _BUILD_HEADERS_READS
    assert set(anthropic.AsyncAnthropic._validate_headers.__code__.co_names) == _VALIDATE_HEADERS_READS
    assert "_build_headers" not in vars(anthropic.AsyncAnthropic)  # the base client's, as pinned above


def _options(**given: Any) -> FinalRequestOptions:
    return FinalRequestOptions.construct(method="post", url="/v1/messages", content=b"{}", **given)


def test_the_anthropic_client_builds_each_set_of_headers_once_as_the_sdk_builds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_AnthropicClient._build_headers` (the SDK's, a private name) is made once per value of
    what it reads and copied: the same headers, in the same order, as the stock client's for
    every timeout, retry count, request headers and credentials; a copy changed by the SDK does
    not change the next request's."""
    built: list[object] = []
    stock_build = anthropic._base_client.build_headers

    def counted(*layers: Any) -> Any:
        built.append(layers)
        return stock_build(*layers)

    monkeypatch.setattr(anthropic._base_client, "build_headers", counted)
    ours = _AnthropicClient(api_key="k", default_headers={"x-custom": "1"})
    stock = anthropic.AsyncAnthropic(api_key="k", default_headers={"x-custom": "1"})
    variants = [
        (_options(), 0),
        (_options(), 1),
        (_options(timeout=60.0), 0),
        (_options(timeout=httpx2.Timeout(5.0, connect=1.0)), 2),
        (_options(timeout=30, headers={"x-extra": "a", "x-custom": "2"}), 0),
        (_options(timeout=30, headers={}), 0),
        (_options(timeout=30.0, headers={}), 0),  # equal to 30 as a number, but sent as `30.0`
        (_options(timeout=httpx2.Timeout(30), headers={}), 0),
        (_options(timeout=httpx2.Timeout(30.0), headers={}), 0),  # the same, inside a Timeout
        (_options(headers={"Authorization": anthropic.omit, "x-api-key": "other"}), 0),
    ]
    for options, retries in variants:
        theirs = stock._build_headers(options, retries_taken=retries)
        for _ in range(3):
            headers = ours._build_headers(options, retries_taken=retries)
            assert headers.raw == theirs.raw and headers.encoding == theirs.encoding
            headers["x-changed-by-the-sdk"] = "1"  # on this request's copy only
    built_by_stock = len(variants)
    assert len(built) == built_by_stock + len(variants)  # ours: once per variant, not three times
    for _ in range(2):  # options built apart, alike (each with its own `NotGiven`): one key
        ours._build_headers(_options(), retries_taken=5)
    assert len(built) == built_by_stock + len(variants) + 1
    ours.api_key = stock.api_key = "rotated"
    options = _options()
    assert ours._build_headers(options).raw == stock._build_headers(options).raw
    assert ours._build_headers(options)["authorization"] == "Bearer rotated"


def _fields(options: FinalRequestOptions) -> dict[str, Any]:
    """The options' fields, `NOT_GIVEN` as one value (each default is a fresh `NotGiven()`)."""
    return {
        name: "NOT_GIVEN" if isinstance(value, anthropic.NotGiven) else value
        for name, value in options.model_dump().items()
    }


async def test_the_options_the_adapter_sends_are_those_post_builds() -> None:
    """`_request_options` gives `request` what `post("/v1/messages", content=..., options=...)`
    gives it (every field, and which are set), built once per timeout and copied per call."""
    client = anthropic.AsyncAnthropic(api_key="k")
    seen: list[FinalRequestOptions] = []

    async def capture(cast_to: Any, options: FinalRequestOptions, **_: Any) -> None:
        seen.append(options)

    client.request = capture  # type: ignore[method-assign]
    for timeout in (anthropic.NOT_GIVEN, 60.0, 30):
        given = {} if timeout is anthropic.NOT_GIVEN else {"timeout": timeout}
        await client.post("/v1/messages", cast_to=httpx2.Response, content=b'{"a":1}', options=given)  # type: ignore[arg-type]
        ours = _request_options(client, timeout, b'{"a":1}')
        assert ours is not None and _fields(ours) == _fields(seen[-1])
        assert ours.model_fields_set == seen[-1].model_fields_set
        again = _request_options(client, timeout, b"{}")
        assert (
            again is not None and again is not ours and again.content == b"{}" and ours.content == b'{"a":1}'
        )
    kept = client._stevora_options  # type: ignore[attr-defined]
    assert list(kept) == [(type(t), t) for t in (anthropic.NOT_GIVEN, 60.0, 30)]
    assert _request_options(client, httpx2.Timeout(5.0), b"{}") is None  # `post` builds those


# What openai's `BaseClient._build_headers` and `AsyncOpenAI._validate_headers` read: the key
# `_OpenAIClient` keeps their headers by (`openai_provider._headers_key`) holds all of it (the
# credentials as `_auth_headers` gives them, the client's headers as `default_headers` gives
# them). An SDK that reads anything else fails here first, and the key must be looked at again.
_OPENAI_BUILD_HEADERS_READS = {
    "Headers", "NotGiven", "Timeout", "_auth_headers", "_idempotency_header", "_merge_headers",
    "_validate_headers", "default_headers", "headers", "httpx2", "idempotency_key", "isinstance",
    "normalize_httpx_timeout", "read", "security", "str", "timeout",
}  # fmt: skip
_OPENAI_VALIDATE_HEADERS_READS = {
    "TypeError",
    "_has_header",
    "_has_omitted_header",
    "_provider_runtime",
    "_sdk_client",
}


def test_the_openai_sdk_builds_headers_from_what_the_adapters_client_keys_them_by() -> None:
    from openai.lib import _client_auth

    base = openai._base_client.BaseClient
    assert set(base._build_headers.__code__.co_names) == _OPENAI_BUILD_HEADERS_READS
    assert "async_validate_headers" in openai.AsyncOpenAI._validate_headers.__code__.co_names
    assert set(_client_auth.async_validate_headers.__code__.co_names) == _OPENAI_VALIDATE_HEADERS_READS
    # The base client's `_build_headers`, as pinned above, for every client class between.
    assert [c for c in openai.AsyncOpenAI.__mro__ if "_build_headers" in vars(c)] == [base]


def _openai_options(**given: Any) -> OpenAIRequestOptions:
    given.setdefault("security", {"bearer_auth": True})
    return OpenAIRequestOptions.construct(method="post", url="/chat/completions", json_data={}, **given)


def test_the_openai_client_builds_each_set_of_headers_once_as_the_sdk_builds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_OpenAIClient._build_headers` (the SDK's, a private name) is made once per value of what
    it reads and copied: the same headers, in the same order, as the stock client's for every
    timeout, retry count, security, request headers (an API-key provider's key among them) and
    credentials; a copy changed by the SDK does not change the next request's. The client's
    `OpenAI-Organization` is an `Omit` made anew on every call: the same key all the same."""
    built: list[object] = []
    stock_merge = openai._base_client._merge_headers

    def counted(*layers: Any) -> Any:
        built.append(layers)
        return stock_merge(*layers)

    monkeypatch.setattr(openai._base_client, "_merge_headers", counted)
    given: dict[str, Any] = {"api_key": "k", "admin_api_key": "admin", "project": "p", "organization": None}
    ours = _OpenAIClient(**given, default_headers={"x-custom": "1"})
    stock = openai.AsyncOpenAI(**given, default_headers={"x-custom": "1"})
    variants = [
        (_openai_options(), 0),
        (_openai_options(), 1),
        (_openai_options(timeout=60.0), 0),
        (_openai_options(timeout=httpx2.Timeout(5.0, connect=1.0)), 2),
        (_openai_options(timeout=30, headers={"x-extra": "a", "x-custom": "2"}), 0),
        (_openai_options(timeout=30, headers={}), 0),
        (_openai_options(timeout=30.0, headers={}), 0),  # equal to 30 as a number, but sent as `30.0`
        (_openai_options(timeout=httpx2.Timeout(30), headers={}), 0),
        (_openai_options(timeout=httpx2.Timeout(30.0), headers={}), 0),  # the same, inside a Timeout
        (_openai_options(headers={"Authorization": "Bearer from-a-key-provider"}), 0),
        (_openai_options(headers={"Authorization": openai.omit}), 0),
        (_openai_options(headers={"OpenAI-Project": openai.Omit()}), 0),
        (_openai_options(security={"admin_api_key_auth": True}), 0),  # the admin key instead
        (_openai_options(security={"bearer_auth": True, "admin_api_key_auth": True}), 0),  # the first's
    ]
    for options, retries in variants:
        theirs = stock._build_headers(options, retries_taken=retries)
        for _ in range(3):
            headers = ours._build_headers(options, retries_taken=retries)
            assert headers.raw == theirs.raw and headers.encoding == theirs.encoding
            headers["x-changed-by-the-sdk"] = "1"  # on this request's copy only
    # The stock client's, then ours once per variant but the last (the API key first, as the first).
    assert len(built) == 2 * len(variants) - 1
    for _ in range(2):  # options built apart, alike (each with its own `NotGiven`): one key
        ours._build_headers(_openai_options(), retries_taken=5)
    assert len(built) == 2 * len(variants)
    ours.api_key = stock.api_key = "rotated"
    ours.organization = stock.organization = "org"
    options = _openai_options()
    assert ours._build_headers(options).raw == stock._build_headers(options).raw
    assert ours._build_headers(options)["authorization"] == "Bearer rotated"
    assert ours._build_headers(options)["openai-organization"] == "org"
    # The SDK sends no idempotency key; a client made to send one sends each request's own.
    ours._idempotency_header = stock._idempotency_header = "Idempotency-Key"
    for key in ("stainless-python-retry-1", "stainless-python-retry-2"):
        options = _openai_options(idempotency_key=key)
        assert ours._build_headers(options).raw == stock._build_headers(options).raw
        assert ours._build_headers(options)["idempotency-key"] == key
    with pytest.raises(TypeError, match="Could not resolve authentication method"):
        ours.api_key = ""
        ours._build_headers(options)  # as the SDK's: checked, not kept


async def test_the_openai_options_the_adapter_sends_are_those_create_builds() -> None:
    """`openai_responses._request_options` gives `request` what the typed `create` (Chat
    Completions and Responses) gives it, every field but the body (`create` transforms it) and
    which fields are set, built once per path and timeout and copied per call."""
    client = openai.AsyncOpenAI(api_key="k")
    seen: list[OpenAIRequestOptions] = []

    async def capture(cast_to: Any, options: OpenAIRequestOptions, **_: Any) -> None:
        seen.append(options)

    client.request = capture  # type: ignore[method-assign]
    body = {"model": "m", "input": "hi"}
    content = b'{"model":"m","input":"hi"}'
    for timeout in (openai.NOT_GIVEN, 60.0, 30):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], timeout=timeout
        )
        await client.responses.create(model="m", input="hi", timeout=timeout)
        for path, theirs in zip(("/chat/completions", "/responses"), seen[-2:], strict=True):
            # The body as the bytes the adapter encoded (`post(content=...)`), or as a dict.
            ours = openai_responses._request_options(client, path, timeout, {"content": content})
            assert ours is not None
            assert _openai_fields(ours) == {**_openai_fields(theirs), "json_data": None, "content": content}
            assert ours.model_fields_set == theirs.model_fields_set
            as_dict = openai_responses._request_options(client, path, timeout, {"body": body})
            assert as_dict is not None and _openai_fields(as_dict) == {
                **_openai_fields(theirs),
                "json_data": body,
            }
            again = openai_responses._request_options(client, path, timeout, {"body": {}})
            assert (
                again is not None
                and again is not as_dict
                and again.json_data == {}
                and as_dict.json_data is body
            )
    kept = client._stevora_options  # type: ignore[attr-defined]
    assert len(kept) == 6
    assert openai_responses._request_options(client, "/responses", httpx2.Timeout(5.0), {"body": {}}) is None


def _openai_fields(options: OpenAIRequestOptions) -> dict[str, Any]:
    """The options' fields, `NOT_GIVEN` as one value (each default is a fresh `NotGiven()`)."""
    return {
        name: "NOT_GIVEN" if isinstance(value, openai.NotGiven) else value
        for name, value in options.model_dump().items()
    }


def test_the_lean_send_finds_httpxs_private_names_and_steps_aside_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`LeanRequests` does httpx's `send` with httpx's private names (`provider._httpx_send`):
    with this httpx all are there (else every call would quietly take httpx's own `send`), and
    an httpx without one of them gets its own `send`, not an AttributeError mid-call."""
    from httpx2 import _client

    from stevora.llm import provider

    found = provider._httpx_send()
    assert found is not None and found.bound_stream is _client.BoundAsyncStream
    assert provider._HTTPX_SEND is not None
    monkeypatch.delattr(httpx2.AsyncClient, "_transport_for_url")
    assert provider._httpx_send() is None
    monkeypatch.undo()
    monkeypatch.delattr(_client, "BoundAsyncStream")
    assert provider._httpx_send() is None


@pytest.mark.parametrize("client_class", [_AnthropicClient, _OpenAIClient])
def test_an_idempotency_key_is_made_only_for_a_client_that_sends_one(
    client_class: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither SDK's client sends an idempotency header, so the adapters' clients make no key
    (the SDK's is a fresh uuid4 per request, read nowhere but that header); a client that does
    send one gets the SDK's own key, a new one each time, in that header."""
    import uuid

    from stevora.llm.provider import UNSENT_IDEMPOTENCY_KEY

    client = client_class(api_key="k", base_url="http://127.0.0.1:1")
    assert client._idempotency_header is None
    with monkeypatch.context() as patched:
        patched.setattr(uuid, "uuid4", lambda: pytest.fail("a key made for nothing"))
        assert client._idempotency_key() == UNSENT_IDEMPOTENCY_KEY
    client._idempotency_header = "Idempotency-Key"
    first, second = client._idempotency_key(), client._idempotency_key()
    assert first.startswith("stainless-python-retry-") and first != second
    options_class = OpenAIRequestOptions if client_class is _OpenAIClient else FinalRequestOptions
    options = options_class.construct(method="post", url="/v1/x", idempotency_key=first)
    assert client._build_request(options).headers["Idempotency-Key"] == first


async def test_the_anthropic_client_copies_its_options_as_the_sdk_does_without_walking_no_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Options as the adapter sends them (a `content` body, nothing to walk) are copied as the
    SDK's `_copy_and_prepare` copies them, without its walk; options with a JSON body, extra body
    or query params get the SDK's own."""
    from anthropic import _base_client

    client = _AnthropicClient(api_key="k", base_url="http://127.0.0.1:1")
    ours = FinalRequestOptions.construct(
        method="post", url="/v1/messages", content=b'{"a":1}', headers={"x": "1"}
    )  # type: ignore[call-arg]
    others = [
        FinalRequestOptions.construct(method="post", url="/v1/x", json_data={"a": {"b": [1]}}),  # type: ignore[call-arg]
        FinalRequestOptions.construct(method="post", url="/v1/x", extra_json={"t": 1}),  # type: ignore[call-arg]
        FinalRequestOptions.construct(method="get", url="/v1/x", params={"q": "1"}),  # type: ignore[call-arg]
    ]
    for options in [ours, *others]:
        theirs = await anthropic.AsyncAnthropic._copy_and_prepare(client, options)
        mine = await client._copy_and_prepare(options)
        assert mine is not options and mine.model_dump() == theirs.model_dump()
    walked = []
    own_walk = _base_client.async_prepare_request_data

    async def walk(*args: Any, **kwargs: Any) -> Any:
        walked.append(args)
        return await own_walk(*args, **kwargs)

    monkeypatch.setattr(_base_client, "async_prepare_request_data", walk)
    await client._copy_and_prepare(ours)
    assert walked == []
    await client._copy_and_prepare(others[0])
    assert len(walked) == 1
