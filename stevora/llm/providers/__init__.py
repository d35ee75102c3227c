"""The providers Stevora can call, one module each in this folder, registered here.

Adding a provider (docs/architecture.md, "Where to add things"): its module (settings, key,
models, build), its `<vendor>_provider.py` adapter when it speaks a new API, and one entry in
each of the two lists below; `tests/unit/llm/test_provider_registry.py` checks they agree. Its
settings become fields of `stevora.settings.Settings` through `ProviderSettings`, its secrets are
redacted from the logs, its models are routed, and `stevora dev` knows whether it is offline.
"""

from __future__ import annotations

from typing import Any, TypeVar

from stevora.llm.providers import anthropic, compatible, openai, scripted
from stevora.llm.providers.base import CallOptions, CallSettings, ProviderSpec

# In routing order: a later provider of the same name replaces an earlier one.
REGISTERED: tuple[ProviderSpec[Any], ...] = (
    openai.PROVIDER,
    anthropic.PROVIDER,
    compatible.PROVIDER,
    scripted.PROVIDER,
)


class ProviderSettings(
    openai.OpenAISettings,
    anthropic.AnthropicSettings,
    compatible.CompatibleSettings,
    scripted.ScriptedSettings,
    CallSettings,
):
    """Every registered provider's settings: one of the bases of `stevora.settings.Settings`."""


Settings_ = TypeVar("Settings_", bound=ProviderSettings)


def key_variables() -> list[str]:
    """The variables that enable a hosted provider (`OPENAI_API_KEY`, ...), for hints."""
    return [name for spec in REGISTERED if (name := spec.key_variable()) is not None]


def keyless(settings: ProviderSettings) -> bool:
    """No hosted provider has its key: only offline models answer."""
    return not any(spec.key_set(settings) for spec in REGISTERED)


def offline_when_keyless(settings: Settings_) -> Settings_:
    """`stevora dev` without keys: every model is answered by the offline fallback provider."""
    if not keyless(settings):
        return settings
    return settings.model_copy(update={spec.fallback: True for spec in REGISTERED if spec.fallback})


__all__ = [
    "REGISTERED",
    "CallOptions",
    "ProviderSettings",
    "ProviderSpec",
    "key_variables",
    "keyless",
    "offline_when_keyless",
]
