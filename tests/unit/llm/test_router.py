"""ProviderRouter: prefix routing, explicit override, unregistered providers."""

from __future__ import annotations

import pytest

from stevora.llm.router import ProviderRouter
from stevora.llm.scripted_provider import ScriptedProvider


@pytest.fixture
def router() -> ProviderRouter:
    return ProviderRouter(
        {
            "openai": ScriptedProvider(name="openai"),
            "anthropic": ScriptedProvider(name="anthropic"),
            "scripted": ScriptedProvider(),
        }
    )


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("gpt-4o", "openai"),
        ("gpt-4o-mini", "openai"),
        ("o1-mini", "openai"),
        ("o3-mini", "openai"),
        ("o4-mini", "openai"),
        ("o1", "openai"),
        ("o3", "openai"),
        ("o4", "openai"),
        ("chatgpt-4o-latest", "openai"),
        ("claude-sonnet-4-20250514", "anthropic"),
        ("claude-haiku-4-5-20251001", "anthropic"),
        ("scripted", "scripted"),
        ("scripted-demo", "scripted"),
        ("scripted:fast", "scripted"),
    ],
)
def test_models_route_by_prefix(router: ProviderRouter, model: str, provider: str):
    resolved = router.resolve(model)
    assert resolved is not None and resolved.name == provider


@pytest.mark.parametrize("model", ["llama3", "o10", "gemini-2.0", "scriptedx", "GPT-4o", ""])
def test_unknown_models_resolve_to_none(router: ProviderRouter, model: str):
    assert router.resolve(model) is None


def test_explicit_provider_wins_over_the_prefix(router: ProviderRouter):
    resolved = router.resolve("gpt-4o", explicit="anthropic")
    assert resolved is not None and resolved.name == "anthropic"


def test_explicit_provider_that_is_not_registered_resolves_to_none(router: ProviderRouter):
    assert router.resolve("gpt-4o", explicit="ollama") is None


def test_prefix_of_an_unregistered_provider_resolves_to_none():
    router = ProviderRouter({"openai": ScriptedProvider(name="openai")})
    assert router.resolve("claude-sonnet-4-20250514") is None


def test_register_and_names():
    router = ProviderRouter()
    ollama = ScriptedProvider(name="ollama")
    router.register("ollama", ollama)
    assert router.names() == ["ollama"]
    assert router.resolve("llama3.2", explicit="ollama") is ollama
    assert router.get("ollama") is ollama
