"""The Anthropic adapter reads two private SDK names (`_constants.MODEL_NONSTREAMING_TOKENS`,
`_calculate_nonstreaming_timeout`); pyproject sets no upper bound on the SDK, so an SDK without
them must neither break the import nor a plain call."""

from __future__ import annotations

import subprocess
import sys
import types

import anthropic
import openai
import pytest

from stevora.llm.anthropic_provider import _AnthropicClient, _nonstreaming_timeout
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
