"""OpenAI's API (`OPENAI_API_KEY`, `OPENAI_BASE_URL`): `gpt-*`, `o1`/`o3`/`o4`, `chatgpt-*` models.

The adapter, and the rate-limit headers it reads, are in stevora/llm/openai_provider.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, Field

from stevora.llm.providers.base import Built, CallOptions, ProviderSpec
from stevora.secrets import SecretKey


class OpenAISettings(BaseModel):
    openai_api_key: SecretKey = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "STEVORA_OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_BASE_URL", "STEVORA_OPENAI_BASE_URL")
    )
    # The API of an `llm` step that does not name one (`api`): Chat Completions or Responses.
    openai_api: Literal["chat", "responses"] = "chat"


def build(settings: OpenAISettings, call: CallOptions) -> Built:
    if not settings.openai_api_key:
        return
    from stevora.llm.openai_provider import OpenAIProvider  # the SDK is imported only when used

    yield (
        "openai",
        OpenAIProvider(
            settings.openai_api_key,
            settings.openai_base_url,
            max_retries=call.max_retries,
            timeout_s=call.timeout_s,
            stream=call.stream,
            default_api=settings.openai_api,
            max_connections=call.max_connections,
            http=call.http,
        ),
    )


PROVIDER = ProviderSpec(
    name="openai",
    settings=OpenAISettings,
    build=build,
    key="openai_api_key",
    model_prefixes=("gpt-", "o1-", "o3-", "o4-", "chatgpt-"),
    models=("o1", "o3", "o4"),
)
