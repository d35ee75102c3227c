"""Build the provider router from settings: the keys and base URLs users already export."""

from __future__ import annotations

import structlog

from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.provider import Provider
from stevora.llm.router import ProviderRouter, provider_name_for_model
from stevora.llm.scripted_provider import ScriptedProvider
from stevora.settings import Settings

log = structlog.get_logger("stevora.llm")


class FallbackRouter(ProviderRouter):
    """A router that answers models of unconfigured providers with the scripted provider."""

    def resolve(self, model: str, explicit: str | None = None) -> Provider | None:
        found = super().resolve(model, explicit)
        if found is None and (explicit is not None or provider_name_for_model(model) is not None):
            return self.get("scripted")
        return found


def build_router(settings: Settings) -> ProviderRouter:
    router: ProviderRouter = FallbackRouter() if settings.scripted_fallback else ProviderRouter()
    retries, timeout_s, stream = (
        settings.provider_max_retries,
        settings.provider_timeout_s,
        settings.llm_stream,
    )
    if settings.openai_api_key:
        router.register(
            "openai",
            OpenAIProvider(
                settings.openai_api_key,
                settings.openai_base_url,
                max_retries=retries,
                timeout_s=timeout_s,
                stream=stream,
            ),
        )
    if settings.anthropic_api_key:
        router.register(
            "anthropic",
            AnthropicProvider(
                settings.anthropic_api_key,
                settings.anthropic_base_url,
                max_retries=retries,
                timeout_s=timeout_s,
                stream=stream,
            ),
        )
    for name, base_url in settings.compat_base_urls.items():
        key = settings.compat_api_keys.get(name, "not-needed")
        provider = OpenAIProvider(
            key,
            base_url,
            name=name,
            max_retries=retries,
            timeout_s=timeout_s,
            capabilities=settings.compat_capabilities.get(name),
            stream=stream,
        )
        router.register(name, provider)
    for name in settings.compat_capabilities.keys() - settings.compat_base_urls.keys():
        log.warning("compat_capabilities_unused", provider=name, hint="no STEVORA_COMPAT_BASE_URLS entry")
    router.register("scripted", ScriptedProvider(latency_s=settings.scripted_latency_s))
    if not settings.openai_api_key and not settings.anthropic_api_key:
        if settings.scripted_fallback:
            log.info("offline_models", hint="no provider keys: the scripted provider answers every model")
        else:
            log.warning(
                "no_provider_keys",
                hint="set OPENAI_API_KEY or ANTHROPIC_API_KEY; only 'scripted' models work",
            )
    return router
