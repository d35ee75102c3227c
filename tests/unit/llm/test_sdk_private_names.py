"""The Anthropic adapter reads two private SDK names (`_constants.MODEL_NONSTREAMING_TOKENS`,
`_calculate_nonstreaming_timeout`); pyproject sets no upper bound on the SDK, so an SDK without
them must neither break the import nor a plain call. The adapters' clients override private SDK
methods (`_prepare_url`, Anthropic's `_build_headers`) and build the SDK's `FinalRequestOptions`:
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
