"""A completed model call of an `llm` step as its row and event payload (the loop's rounds and
the `compact` strategy's summary calls are recorded alike)."""

from __future__ import annotations

from typing import Any

from stevora.db.checkpoints import LlmCallRecord
from stevora.engine.steps.base import StepExecution
from stevora.llm.messages import LlmResponse


def completed_call(
    ex: StepExecution,
    round_: int,
    provider: str,
    model: str,
    request: dict[str, Any],
    response: LlmResponse,
    answer: tuple[str | None, list[dict[str, str]]],
    cost: float | None,
    duration_ms: float,
    time_to_first_token_ms: float | None = None,
    response_extra: dict[str, Any] | None = None,
) -> tuple[LlmCallRecord, dict[str, Any]]:
    """The row of a completed call (`answer`: its text and tool calls as stored) and the payload
    its event starts from."""
    usage = response.usage
    text, calls = answer
    rec = LlmCallRecord(
        step_run_id=ex.step_run_id,
        step_name=ex.step_name,
        round=round_,
        provider=provider,
        model=model,
        status="completed",
        request=request,
        response={
            "text": text,
            "toolCalls": calls,
            "responseModel": response.model,
            "responseId": response.response_id,
            "priced": cost is not None,
            # Thinking blocks / reasoning items, each its JSON text as a string (jsonb keeps a
            # string byte for byte): every later round sends them back unchanged.
            **({"reasoning": [r.to_dict() for r in response.reasoning]} if response.reasoning else {}),
            **(response_extra or {}),
        },
        finish_reason=response.finish_reason,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cost_usd=cost or 0.0,
        duration_ms=duration_ms,
        time_to_first_token_ms=time_to_first_token_ms,
    )
    payload = {
        "llmCallId": rec.id,
        "model": model,
        "provider": provider,
        "round": round_,
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "cacheReadTokens": usage.cache_read_tokens,
        "cacheWriteTokens": usage.cache_write_tokens,
        "costUsd": rec.cost_usd,
        "durationMs": round(duration_ms, 3),
    }
    return rec, payload
