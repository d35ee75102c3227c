"""Contracts of the tool loop's model calls and of a resumed step's rebuilt state that the second
mutation pass found unpinned (docs/testing.md, "Mutation testing"): the failed call's checkpoint
and log line, a call's price and timing, which provider each model of the fallback chain goes to,
and what a retried step carries over from its earlier attempt. Asserted on rows, events, logs and the requests the
providers received."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from stevora.llm.messages import Usage
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    error,
    openai_text,
    openai_tool_calls,
)
from stevora.testing.fake_stream import streamed
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency
from tests.integration.loop.test_loop_contracts import STOCK_TOOL, _stock_tool

FIRST_TOKEN_S = 0.2


def _warnings(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in entry.items() if k not in ("workflow_run_id", "step_name", "attempt")}
        for entry in logs
        if entry["event"] == event
    ]


async def test_a_stream_that_breaks_is_checkpointed_and_logged_as_a_failed_call(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """The failed attempt keeps its request, its error (with `retryable`), its timing and the
    time its stream took to begin; its event repeats the row; operators get one warning."""
    fake.openai.enqueue(
        streamed(openai_text("This answer never finishes"), first_token_s=FIRST_TOKEN_S, error_after=2)
    )
    fake.anthropic.enqueue(anthropic_text("Here is the answer."))
    step = llm_step(fallbackModels=["claude-haiku-4-5"], temperature=0.5, retry={"maxAttempts": 1})
    with structlog.testing.capture_logs() as logs:
        result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    failed, answered = result.llm_calls
    assert (failed["status"], failed["round"], failed["step_name"]) == ("failed", 1, "agent")
    assert (failed["provider"], failed["model"]) == ("openai", "gpt-4o-mini")
    assert failed["request"] == {**answered["request"], "model": "gpt-4o-mini"}
    assert failed["request"]["messages"] == [{"role": "user", "content": "Hello?"}]
    error_record = dict(failed["error"])
    assert error_record == {
        "code": "LLM_PROVIDER_ERROR",
        "message": "openai stream broke after the answer began: fake stream failure",
        "details": {"provider": "openai", "statusCode": None, "retryAfterSeconds": None},
        "retryable": True,
    }
    assert failed["response"] is None and failed["cost_usd"] == 0
    assert failed["time_to_first_token_ms"] >= FIRST_TOKEN_S * 1000  # it did begin to answer
    assert failed["time_to_first_token_ms"] <= failed["duration_ms"] < 10_000

    (event,) = result.events_of("LLM_CALL_FAILED")
    assert event == {
        "llmCallId": failed["id"],
        "model": "gpt-4o-mini",
        "provider": "openai",
        "round": 1,
        "error": error_record,
        "durationMs": round(failed["duration_ms"], 3),
    }
    assert _warnings(logs, "llm_call_failed") == [
        {
            "event": "llm_call_failed",
            "log_level": "warning",
            "model": "gpt-4o-mini",
            "provider": "openai",
            "error": error_record["message"],
        }
    ]
    await assert_trace_event_consistency(harness, result.id)


async def test_the_steps_provider_serves_its_primary_model_only(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """`provider` names the primary model's provider; fallbacks route by their own prefix."""
    sdk.openai(name="gateway")  # a second OpenAI-compatible provider on the same fake
    fake.openai.enqueue(error(500, "gateway down"), openai_text("From the fallback."))
    step = llm_step(provider="gateway", fallbackModels=["gpt-4o"], retry={"maxAttempts": 1})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert [(c["provider"], c["model"], c["status"]) for c in result.llm_calls] == [
        ("gateway", "gpt-4o-mini", "failed"),
        ("openai", "gpt-4o", "completed"),
    ]
    assert [e["provider"] for e in result.events_of("LLM_CALL_FAILED")] == ["gateway"]
    assert [e["provider"] for e in result.events_of("LLM_CALL_COMPLETED")] == ["openai"]


async def test_a_fallback_without_a_provider_does_not_hide_the_primarys_failure(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """A 503 stays the step's (retryable) error when the only fallback has no provider."""
    fake.openai.enqueue(error(503, "overloaded"))
    step = llm_step(fallbackModels=["mystery-1"], retry={"maxAttempts": 1})
    with structlog.testing.capture_logs() as logs:
        result = await run_workflow(harness, workspace_id, step)

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "LLM_PROVIDER_ERROR"
    assert "overloaded" in result.run["error"]["message"]
    assert [(c["model"], c["status"]) for c in result.llm_calls] == [("gpt-4o-mini", "failed")]
    assert _warnings(logs, "no_provider_for_model") == [
        {
            "event": "no_provider_for_model",
            "log_level": "warning",
            "model": "mystery-1",
            "hint": "trying next",
        }
    ]


async def test_a_model_without_a_provider_fails_the_step_naming_the_model(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    result = await run_workflow(harness, workspace_id, llm_step(model="mystery-1", retry={"maxAttempts": 1}))

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "PROVIDER_NOT_FOUND"
    assert result.run["error"]["message"] == "No provider configured for model 'mystery-1'"
    assert result.run["error"]["details"] == {"model": "mystery-1"}
    assert result.llm_calls == [] and fake.openai.requests == []


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ({"name": "check_stock"}, {"type": "function", "function": {"name": "check_stock"}}),
        ("required", "required"),
    ],
)
async def test_tool_choice_binds_and_is_stored_with_the_first_call_only(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    choice: Any,
    sent: Any,
) -> None:
    _stock_tool(harness)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "check_stock", '{"sku": 1}')]),
        openai_text("None left."),
    )
    result = await run_workflow(harness, workspace_id, llm_step(tools=[STOCK_TOOL], toolChoice=choice))

    assert result.status == "COMPLETED", result.run["error"]
    first, second = (c["request"] for c in result.llm_calls)
    assert first["toolChoice"] == choice
    assert "toolChoice" not in second
    assert fake.openai.requests[0].json["tool_choice"] == sent
    assert fake.openai.requests[1].json.get("tool_choice", "auto") == "auto"


async def test_an_unpriced_model_is_recorded_at_zero_cost_with_its_timing(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3}
    answer = openai_text("Hi.", model="gpt-does-not-exist", usage=usage)
    fake.openai.enqueue(streamed(answer, first_token_s=FIRST_TOKEN_S))
    result = await run_workflow(harness, workspace_id, llm_step(model="gpt-does-not-exist"))

    assert result.status == "COMPLETED", result.run["error"]
    (call,) = result.llm_calls
    assert call["response"]["priced"] is False and call["cost_usd"] == 0.0
    assert (call["input_tokens"], call["output_tokens"]) == (12, 3)
    ttft = call["time_to_first_token_ms"]
    assert FIRST_TOKEN_S * 1000 <= ttft <= call["duration_ms"] < 10_000
    (event,) = result.events_of("LLM_CALL_COMPLETED")
    assert (event["costUsd"], event["inputTokens"], event["outputTokens"]) == (0.0, 12, 3)
    assert (event["timeToFirstTokenMs"], event["durationMs"]) == (
        round(ttft, 3),
        round(call["duration_ms"], 3),
    )


async def test_a_call_is_priced_by_the_model_that_answered(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """An alias the catalogue does not know is priced as the model the provider says answered."""
    usage = {"prompt_tokens": 1000, "completion_tokens": 100}
    fake.openai.enqueue(openai_text("Hi.", model="gpt-4o-mini", usage=usage))
    result = await run_workflow(harness, workspace_id, llm_step(model="gpt-house-alias"))

    assert result.status == "COMPLETED", result.run["error"]
    (call,) = result.llm_calls
    assert (call["model"], call["response"]["responseModel"]) == ("gpt-house-alias", "gpt-4o-mini")
    expected = harness.rt.pricing.cost_usd("openai", "gpt-4o-mini", Usage(1000, 100))
    assert expected and call["response"]["priced"] is True
    assert call["cost_usd"] == pytest.approx(expected)


async def test_a_retried_step_keeps_counting_its_tool_rounds(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """Attempt 1's tool rounds count against `maxToolRounds` in attempt 2."""
    _stock_tool(harness)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "check_stock", '{"sku": 1}')]),
        openai_tool_calls([("call_2", "check_stock", '{"sku": 2}')]),
        error(503, "overloaded"),  # attempt 1 ends after two tool rounds
        openai_tool_calls([("call_3", "check_stock", '{"sku": 3}')]),  # round 3: over the limit
        openai_tool_calls([("call_4", "check_stock", '{"sku": 4}')]),
    )
    step = llm_step(tools=[STOCK_TOOL], maxToolRounds=2, retry={"maxAttempts": 2, "backoffMs": 100})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "MAX_TOOL_ROUNDS"
    assert [s["status"] for s in result.step_runs] == ["FAILED", "FAILED"]
    assert [(c["round"], c["status"]) for c in result.llm_calls] == [
        (1, "completed"),
        (2, "completed"),
        (3, "failed"),
        (3, "completed"),
    ]
    assert len(result.traces) == 2  # the over-limit round's call was not executed
    assert len(fake.openai.requests) == 4


async def test_a_retried_step_keeps_counting_its_feedback_rounds(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """A feedback round committed in attempt 1 counts against `maxFeedbackAttempts` in attempt 2
    (the round whose call failed is resent, not counted)."""
    bad = '{"summary": "missing the score", "confidence": 0.9}'
    fake.anthropic.enqueue(
        anthropic_text(bad),
        anthropic_text(bad),  # feedback round 1
        anthropic_text(bad),  # feedback round 2
        error(503, "overloaded"),  # feedback round 3 fails: attempt 1 ends
        anthropic_text(bad),  # feedback round 3, resent by attempt 2: attempts are spent
        anthropic_text(bad),
        anthropic_text(bad),
    )
    step = llm_step(
        model="claude-haiku-4-5",
        responseFormat="json",
        outputSchema={"riskScore": {"type": "number"}, "summary": {"type": "string"}},
        structuredOutput="prompt",
        guardrails={
            "postChecks": [{"type": "schema_validation"}],
            "onFailure": "retry_with_feedback",
            "maxFeedbackAttempts": 3,
        },
        retry={"maxAttempts": 2, "backoffMs": 100},
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "GUARDRAIL_FAILED"
    guardrail_events = result.events_of("GUARDRAIL_FAILED")
    assert [(e["round"], e["action"]) for e in guardrail_events] == [
        (1, "retry_with_feedback"),
        (2, "retry_with_feedback"),
        (3, "retry_with_feedback"),
        (3, "retry_with_feedback"),  # attempt 2 re-decides the round its failed call followed
        (4, "block"),
    ]
    assert [(c["round"], c["status"], c["request"].get("feedback")) for c in result.llm_calls] == [
        (1, "completed", None),
        (2, "completed", True),
        (3, "completed", True),
        (4, "failed", True),
        (4, "completed", True),
    ]
    assert len(fake.anthropic.requests) == 5
