"""Cost of one LLM call in USD, from `genai-prices`' bundled snapshot or configured overrides.

`genai_prices.Usage.input_tokens` has the same meaning as ours (every prompt token, cache reads
and writes included; the cache counts are subsets billed at their own rates), so the mapping is
one to one and both providers' cost formulas come out right:
OpenAI `(prompt - cached)·in + cached·cached_in + completion·out`, Anthropic
`input·in + cache_read·read + cache_write·write + output·out` with Anthropic's own `input`
being our `input_tokens - cache_read - cache_write`.

Only the snapshot shipped inside the wheel is used: nothing here starts `UpdatePrices`, so no
network access happens. Unknown models cost `None`; the caller records 0 and flags the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache

import genai_prices
from genai_prices import data_snapshot

from stevora.llm.messages import Usage

SCRIPTED_PROVIDER = "scripted"


class Pricing:
    """Prices with per-model overrides: `{"my-model": (input_usd_per_mtok, output_usd_per_mtok)}`."""

    def __init__(self, overrides: Mapping[str, tuple[float, float]] | None = None) -> None:
        self._overrides = {model.lower(): (float(i), float(o)) for model, (i, o) in (overrides or {}).items()}

    def cost_usd(self, provider: str, model: str, usage: Usage) -> float | None:
        """Cost of `usage` on `model` served by `provider`; `None` when no price is known."""
        if provider == SCRIPTED_PROVIDER or model.startswith(SCRIPTED_PROVIDER):
            return 0.0
        override = self._overrides.get(model.lower())
        if override is not None:
            input_per_mtok, output_per_mtok = override
            return (usage.input_tokens * input_per_mtok + usage.output_tokens * output_per_mtok) / 1_000_000
        return _catalog_cost(provider, model, usage)

    def known_name(self, provider: str, model: str) -> str | None:
        """The name `model` has in the price list — an override's key or the catalogue's own id
        (`gpt-4o` for `gpt-4o-2024-08-06`) — or `None` when it is not priced. Never the caller's
        string itself: the catalogue matches by prefix, so any suffix would pass through."""
        if provider == SCRIPTED_PROVIDER or model.startswith(SCRIPTED_PROVIDER):
            return None
        if model.lower() in self._overrides:
            return model.lower()
        provider_id = _provider_id(provider)
        return _catalog_name(provider_id, model) if provider_id is not None else None


def cost_usd(provider: str, model: str, usage: Usage) -> float | None:
    """Cost from the bundled price catalogue alone (no overrides)."""
    return _DEFAULT.cost_usd(provider, model, usage)


@lru_cache(maxsize=8192)
def _catalog_cost(provider: str, model: str, usage: Usage) -> float | None:
    # Usage is frozen, so whole calls are cacheable; the day is not part of the key, but
    # genai-prices' dated price changes are months apart.
    provider_id = _provider_id(provider)
    if provider_id is None or not _is_known(provider_id, model):
        return None
    try:
        calculation = genai_prices.calc_price(
            genai_prices.Usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_read_tokens=usage.cache_read_tokens,
                cache_write_tokens=usage.cache_write_tokens,
            ),
            model,
            provider_id=provider_id,
            genai_request_timestamp=datetime.now(tz=UTC),
        )
    except ValueError:
        # Inconsistent counts (cache reads above input): better an unpriced call than a failed step.
        return None
    return float(calculation.total_price)


@lru_cache(maxsize=256)
def _provider_id(provider: str) -> str | None:
    """The catalogue's id for one of our provider names (`ollama` and other local servers: none)."""
    found = data_snapshot.find_provider_by_id(data_snapshot.get_snapshot().providers, provider)
    return found.id if found is not None else None


@lru_cache(maxsize=4096)
def _catalog_name(provider_id: str, model: str) -> str | None:
    try:
        _provider, found = data_snapshot.get_snapshot().find_provider_model(model, None, provider_id, None)
    except LookupError:
        return None
    return found.id


def _is_known(provider_id: str, model: str) -> bool:
    return _catalog_name(provider_id, model) is not None


_DEFAULT = Pricing()
