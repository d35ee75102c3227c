"""Pricing: genai-prices snapshot (offline), cache-aware formulas, overrides, unknown models."""

from __future__ import annotations

import socket

import pytest

from stevora.llm.messages import Usage
from stevora.llm.pricing import Pricing, cost_usd


def test_gpt_4o_bills_cached_prompt_tokens_at_the_cached_rate():
    # $2.50 in, $1.25 cached in, $10 out per MTok: (1000-400)*2.5 + 400*1.25 + 100*10
    usage = Usage(input_tokens=1000, cache_read_tokens=400, output_tokens=100)
    assert cost_usd("openai", "gpt-4o", usage) == pytest.approx((600 * 2.5 + 400 * 1.25 + 100 * 10) / 1e6)


def test_dated_model_aliases_are_priced():
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert cost_usd("openai", "gpt-4o-mini-2024-07-18", usage) == pytest.approx(0.15 + 0.60)


def test_claude_sonnet_4_bills_cache_reads_and_writes_separately():
    # Our input_tokens include cache tokens; Anthropic's own input is 1000 - 200 - 300 = 500.
    # $3 in, $0.30 cache read, $3.75 cache write (5 min), $15 out per MTok.
    usage = Usage(input_tokens=1000, cache_read_tokens=200, cache_write_tokens=300, output_tokens=100)
    expected = (500 * 3 + 200 * 0.30 + 300 * 3.75 + 100 * 15) / 1e6
    assert cost_usd("anthropic", "claude-sonnet-4-20250514", usage) == pytest.approx(expected)


def test_unknown_model_or_provider_has_no_price():
    usage = Usage(input_tokens=10, output_tokens=10)
    assert cost_usd("openai", "gpt-does-not-exist", usage) is None
    assert cost_usd("ollama", "llama3.2", usage) is None


def test_scripted_calls_are_free():
    assert cost_usd("scripted", "scripted", Usage(input_tokens=1000, output_tokens=1000)) == 0.0


def test_override_prices_input_and_output_per_million_tokens():
    pricing = Pricing({"my-model": (1.0, 2.0), "gpt-4o": (0.0, 0.0)})
    usage = Usage(input_tokens=2_000_000, output_tokens=500_000)
    assert pricing.cost_usd("ollama", "my-model", usage) == pytest.approx(3.0)
    assert pricing.cost_usd("openai", "gpt-4o", usage) == 0.0  # an override beats the catalogue
    assert pricing.cost_usd("openai", "gpt-4o-mini", usage) == cost_usd("openai", "gpt-4o-mini", usage)


def test_inconsistent_usage_is_unpriced_rather_than_an_error():
    assert cost_usd("openai", "gpt-4o", Usage(input_tokens=10, cache_read_tokens=50)) is None


def test_pricing_never_touches_the_network(monkeypatch: pytest.MonkeyPatch):
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pricing tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert cost_usd("openai", "o3-mini", Usage(input_tokens=123, output_tokens=45)) is not None
    assert (
        cost_usd("anthropic", "claude-3-5-haiku-20241022", Usage(input_tokens=7, output_tokens=8)) is not None
    )


def test_known_name_is_the_price_lists_name_never_the_callers_string():
    pricing = Pricing({"My-Model": (1.0, 2.0)})
    assert pricing.known_name("openai", "gpt-4o") == "gpt-4o"
    assert pricing.known_name("openai", "gpt-4o-2024-08-06") == "gpt-4o"
    # The catalogue matches some families by prefix: the suffix must not come through.
    assert pricing.known_name("anthropic", "claude-3-5-sonnet-acme-secret") == "claude-3-5-sonnet"
    assert pricing.known_name("openai", "gpt-4o-acme-secret") is None
    assert pricing.known_name("ollama", "my-model") == "my-model"
    assert pricing.known_name("ollama", "llama3.2") is None
    assert pricing.known_name("scripted", "scripted:acme-secret") is None
