"""LLM provider layer: neutral messages, provider adapters, routing, pricing, transcript repair.

The SDK-backed adapters and pricing are imported lazily: `openai`, `anthropic` and
`genai_prices` take a noticeable time to import, and importing `stevora.llm.messages` (which
runs this file first) should not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stevora.llm.messages import LlmRequest, LlmResponse, Message, ToolCall, ToolSpec, Usage
from stevora.llm.provider import Provider
from stevora.llm.router import ProviderRouter, provider_name_for_model
from stevora.llm.scripted_provider import ScriptedProvider
from stevora.llm.transcript import prepare_transcript

if TYPE_CHECKING:
    from stevora.llm.anthropic_provider import AnthropicProvider
    from stevora.llm.openai_provider import OpenAIProvider
    from stevora.llm.pricing import Pricing, cost_usd

_LAZY: dict[str, str] = {
    "AnthropicProvider": "stevora.llm.anthropic_provider",
    "OpenAIProvider": "stevora.llm.openai_provider",
    "Pricing": "stevora.llm.pricing",
    "cost_usd": "stevora.llm.pricing",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AnthropicProvider",
    "LlmRequest",
    "LlmResponse",
    "Message",
    "OpenAIProvider",
    "Pricing",
    "Provider",
    "ProviderRouter",
    "ScriptedProvider",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "cost_usd",
    "prepare_transcript",
    "provider_name_for_model",
]
