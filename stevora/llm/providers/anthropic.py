"""Anthropic's API (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`): `claude-*` models.

The adapter, and the rate-limit headers it reads, are in stevora/llm/anthropic_provider.py.
"""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, Field

from stevora.llm.providers.base import Built, CallOptions, ProviderSpec
from stevora.secrets import SecretKey


class AnthropicSettings(BaseModel):
    anthropic_api_key: SecretKey = Field(
        default=None, validation_alias=AliasChoices("ANTHROPIC_API_KEY", "STEVORA_ANTHROPIC_API_KEY")
    )
    anthropic_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("ANTHROPIC_BASE_URL", "STEVORA_ANTHROPIC_BASE_URL")
    )


def build(settings: AnthropicSettings, call: CallOptions) -> Built:
    if not settings.anthropic_api_key:
        return
    from stevora.llm.anthropic_provider import AnthropicProvider  # the SDK is imported only when used

    yield (
        "anthropic",
        AnthropicProvider(
            settings.anthropic_api_key,
            settings.anthropic_base_url,
            max_retries=call.max_retries,
            timeout_s=call.timeout_s,
            stream=call.stream,
            max_connections=call.max_connections,
            http=call.http,
        ),
    )


PROVIDER = ProviderSpec(
    name="anthropic",
    settings=AnthropicSettings,
    build=build,
    key="anthropic_api_key",
    model_prefixes=("claude-",),
)
