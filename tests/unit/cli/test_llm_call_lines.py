"""`stevora runs llm-calls`: a call that reasoned says how many of its output tokens it spent so."""

from __future__ import annotations

from stevora.cli.render import llm_call_lines
from stevora.client.models import LlmCall


def _call(**fields: object) -> LlmCall:
    base = {"id": "llm_1", "workflowRunId": "wfrun_1", "stepName": "agent", "round": 1, "model": "o4-mini",
            "provider": "openai", "status": "completed", "inputTokens": 20, "outputTokens": 12,
            "finishReason": "stop"}  # fmt: skip
    return LlmCall.model_validate({**base, **fields})


def test_reasoning_tokens_are_shown_only_for_calls_that_reasoned() -> None:
    (reasoned,) = llm_call_lines([_call(reasoningTokens=7)])
    assert "12 out (7 reasoning)" in reasoned
    (plain,) = llm_call_lines([_call()])
    assert "reasoning" not in plain
