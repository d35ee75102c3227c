"""Model name -> provider, by prefix (docs/tool-calling.md, "Providers and keys"), plus an explicit override.

The documented map only has `gpt-`, `o1-`, `o3-`, `claude-`; we also route the bare reasoning
model names (`o1`, `o3`, `o4`), `o4-*`, `chatgpt-*` and the offline `scripted` model. A model
whose prefix points at a provider that is not registered resolves to `None`, like an unknown one.
"""

from __future__ import annotations

from collections.abc import Mapping

from stevora.llm.provider import Provider

# Checked in order; first match wins.
MODEL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("gpt-", "openai"),
    ("o1-", "openai"),
    ("o3-", "openai"),
    ("o4-", "openai"),
    ("chatgpt-", "openai"),
    ("claude-", "anthropic"),
    ("scripted-", "scripted"),
    ("scripted:", "scripted"),
)
EXACT_MODELS: Mapping[str, str] = {"o1": "openai", "o3": "openai", "o4": "openai", "scripted": "scripted"}


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
