"""Model name -> provider, by prefix (docs/tool-calling.md, "Providers and keys"), plus an explicit override.

The prefixes and exact model names are each provider's own (`model_prefixes`, `models` in
stevora/llm/providers/). A model whose prefix points at a provider that is not configured
resolves to `None`, like an unknown one.
"""

from __future__ import annotations

from collections.abc import Mapping

from stevora.llm.provider import Provider
from stevora.llm.providers import REGISTERED

# Checked in order; first match wins. Each provider declares its own (stevora/llm/providers/).
MODEL_PREFIXES: tuple[tuple[str, str], ...] = tuple(
    (prefix, spec.name) for spec in REGISTERED for prefix in spec.model_prefixes
)
EXACT_MODELS: Mapping[str, str] = {model: spec.name for spec in REGISTERED for model in spec.models}


def provider_name_for_model(model: str) -> str | None:
    """The provider name a model id routes to by convention, or `None`."""
    exact = EXACT_MODELS.get(model)
    if exact is not None:
        return exact
    for prefix, name in MODEL_PREFIXES:
        if model.startswith(prefix):
            return name
    return None


class ProviderRouter:
    """Registered providers by name; `resolve` picks one for a model."""

    def __init__(self, providers: Mapping[str, Provider] | None = None) -> None:
        self._providers: dict[str, Provider] = dict(providers or {})

    def register(self, name: str, provider: Provider) -> None:
        self._providers[name] = provider

    def names(self) -> list[str]:
        return list(self._providers)

    def get(self, name: str) -> Provider | None:
        return self._providers.get(name)

    def resolve(self, model: str, explicit: str | None = None) -> Provider | None:
        """The explicitly named provider if given, else the one the model's prefix maps to."""
        if explicit is not None:
            return self._providers.get(explicit)
        name = provider_name_for_model(model)
        return self._providers.get(name) if name is not None else None

    async def aclose(self) -> None:
        """Close every registered provider (each closes only the SDK client it created)."""
        for provider in self._providers.values():
            await provider.aclose()
