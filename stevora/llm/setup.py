"""Build the provider router from settings: every registered provider the settings configure."""

from __future__ import annotations

import structlog

from stevora.llm.provider import Provider
from stevora.llm.providers import REGISTERED, ProviderSettings, key_variables, keyless
from stevora.llm.router import ProviderRouter, provider_name_for_model

log = structlog.get_logger("stevora.llm")


class FallbackRouter(ProviderRouter):
    """A router that answers models of unconfigured providers with one offline provider."""

    def __init__(self, fallback: str) -> None:
        super().__init__()
        self.fallback = fallback

    def resolve(self, model: str, explicit: str | None = None) -> Provider | None:
        found = super().resolve(model, explicit)
        if found is None and (explicit is not None or provider_name_for_model(model) is not None):
            return self.get(self.fallback)
        return found


def build_router(settings: ProviderSettings) -> ProviderRouter:
    fallback = next((spec.name for spec in REGISTERED if spec.answers_unconfigured(settings)), None)
    router = FallbackRouter(fallback) if fallback is not None else ProviderRouter()
    call = settings.call_options()
    for spec in REGISTERED:
        for name, provider in spec.build(settings, call):
            router.register(name, provider)
    if keyless(settings):
        if fallback is not None:
            log.info("offline_models", hint=f"no provider keys: the {fallback} provider answers every model")
        else:
            log.warning(
                "no_provider_keys",
                hint=f"set {' or '.join(key_variables())}; only 'scripted' models work",
            )
    return router
