"""What a provider declares: its settings, which of them is its key, the models it answers by
name, and how its clients are built. Its secrets are the settings it types `SecretKey` or
`SecretsByName` (stevora/secrets.py): the logs redact them without a list to keep.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import AliasChoices, BaseModel

from stevora.llm.provider import HttpStack, Provider


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What every SDK-backed client is built with."""

    max_retries: int
    timeout_s: float
    stream: bool
    max_connections: int = 2000  # per SDK client: in-flight calls, and connections kept alive
    http: HttpStack = "aiohttp"  # the HTTP stack under the SDKs (`sdk_http_client`)


class CallSettings(BaseModel):
    """The settings every provider's calls share."""

    provider_max_retries: int = 2
    # Stream model answers (live text deltas, time to first token); false: one JSON answer per call.
    llm_stream: bool = True
    provider_timeout_s: float = 120.0
    # Connections per provider client, each kept alive for the next call; 0: as many as runs one
    # worker executes at once (`STEVORA_MAX_CONCURRENT_RUNS`). The SDKs' own default, 1,000 with
    # 100 kept alive, queued calls past 1,000 in flight and reconnected past 100.
    provider_max_connections: int = 0
    # The HTTP stack under the SDK clients: `aiohttp` (the SDKs' aiohttp transport, ~1,400 fewer
    # Python calls per model call) or `httpx` (the SDKs' own default, pure Python).
    provider_http: HttpStack = "aiohttp"

    def call_options(self) -> CallOptions:
        connections = self.provider_max_connections or int(getattr(self, "max_concurrent_runs", 2000))
        return CallOptions(
            self.provider_max_retries,
            self.provider_timeout_s,
            self.llm_stream,
            connections,
            self.provider_http,
        )


SettingsT = TypeVar("SettingsT", bound=BaseModel)
Built = Iterable[tuple[str, Provider]]


@dataclass(frozen=True, slots=True)
class ProviderSpec(Generic[SettingsT]):
    """One provider, as `stevora/llm/providers/__init__.py` registers it."""

    name: str
    settings: type[SettingsT]
    """Its fields of `Settings` (env names included); a base of `ProviderSettings`."""
    build: Callable[[SettingsT, CallOptions], Built]
    """The (name, provider) pairs the settings configure; none when its key is unset."""
    key: str | None = None
    """The field holding a hosted service's key: with no such key set, Stevora is offline."""
    model_prefixes: tuple[str, ...] = ()
    """Model ids starting with one of these route to it (docs/tool-calling.md)."""
    models: tuple[str, ...] = ()
    """Model ids routed to it as they are."""
    fallback: str | None = None
    """The boolean field that, when true, routes models of unconfigured providers to this one."""

    def key_set(self, settings: BaseModel) -> bool:
        return self.key is not None and bool(getattr(settings, self.key))

    def answers_unconfigured(self, settings: BaseModel) -> bool:
        return self.fallback is not None and bool(getattr(settings, self.fallback))

    def key_variable(self) -> str | None:
        """The environment variable users set for its key (`OPENAI_API_KEY`), for hints."""
        if self.key is None:
            return None
        alias = self.settings.model_fields[self.key].validation_alias
        if isinstance(alias, AliasChoices):
            return str(alias.choices[0])
        return f"STEVORA_{self.key.upper()}"
