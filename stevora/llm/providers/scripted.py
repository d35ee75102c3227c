"""The offline `scripted` provider (stevora/llm/scripted_provider.py): `scripted`, `scripted-*`
and `scripted:*` models, and every model of an unconfigured provider under `STEVORA_SCRIPTED_FALLBACK`.
"""

from __future__ import annotations

from pydantic import BaseModel

from stevora.llm.providers.base import Built, CallOptions, ProviderSpec
from stevora.llm.scripted_provider import ScriptedProvider


class ScriptedSettings(BaseModel):
    # Route models whose provider has no key to the offline `scripted` provider instead of failing
    # (`stevora dev` turns this on when no provider key is set, so every example runs offline).
    scripted_fallback: bool = False
    # Simulated model latency of the scripted provider (demos, load tests).
    scripted_latency_s: float = 0.0


def build(settings: ScriptedSettings, _call: CallOptions) -> Built:
    yield "scripted", ScriptedProvider(latency_s=settings.scripted_latency_s)


PROVIDER = ProviderSpec(
    name="scripted",
    settings=ScriptedSettings,
    build=build,
    model_prefixes=("scripted-", "scripted:"),
    models=("scripted",),
    fallback="scripted_fallback",
)
