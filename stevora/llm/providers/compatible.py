"""OpenAI-compatible servers (Ollama, vLLM, llama.cpp, OpenRouter), each under its own provider name:
`STEVORA_COMPAT_BASE_URLS`, `STEVORA_COMPAT_API_KEYS`, `STEVORA_COMPAT_CAPABILITIES` (docs/providers.md).

They speak OpenAI's Chat Completions, so the adapter is stevora/llm/openai_provider.py; what
differs between servers is a `ServerCapabilities` each.
"""

from __future__ import annotations

import structlog
from pydantic import BaseModel

from stevora.llm.capabilities import ServerCapabilities
from stevora.llm.providers.base import Built, CallOptions, ProviderSpec
from stevora.secrets import SecretsByName

log = structlog.get_logger("stevora.llm")


class CompatibleSettings(BaseModel):
    # Extra OpenAI-compatible servers: {"ollama": "http://localhost:11434/v1"}; key via compat_api_keys.
    compat_base_urls: dict[str, str] = {}
    compat_api_keys: SecretsByName = {}
    # What each compat server accepts, by the same names: {"vllm": {"tool_choice": ["auto", "required"]}}.
    compat_capabilities: dict[str, ServerCapabilities] = {}


def build(settings: CompatibleSettings, call: CallOptions) -> Built:
    if settings.compat_base_urls:
        from stevora.llm.openai_provider import OpenAIProvider  # the SDK is imported only when used

        for name, base_url in settings.compat_base_urls.items():
            key = settings.compat_api_keys.get(name, "not-needed")
            provider = OpenAIProvider(
                key,
                base_url,
                name=name,
                max_retries=call.max_retries,
                timeout_s=call.timeout_s,
                capabilities=settings.compat_capabilities.get(name),
                stream=call.stream,
                max_connections=call.max_connections,
                http=call.http,
            )
            yield name, provider
    for name in settings.compat_capabilities.keys() - settings.compat_base_urls.keys():
        log.warning("compat_capabilities_unused", provider=name, hint="no STEVORA_COMPAT_BASE_URLS entry")


PROVIDER = ProviderSpec(name="compatible", settings=CompatibleSettings, build=build)
