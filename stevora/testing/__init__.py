"""Test doubles shipped with Stevora (like dramatiq's StubBroker): fake LLM provider servers."""

from __future__ import annotations

from stevora.testing.fake_llm import (
    FakeLLMServer,
    FakeResponse,
    RecordedRequest,
    anthropic_text,
    anthropic_tool_use,
    disconnect,
    error,
    openai_text,
    openai_tool_calls,
    scripted_responder,
)

__all__ = [
    "FakeLLMServer",
    "FakeResponse",
    "RecordedRequest",
    "anthropic_text",
    "anthropic_tool_use",
    "disconnect",
    "error",
    "openai_text",
    "openai_tool_calls",
    "scripted_responder",
]
