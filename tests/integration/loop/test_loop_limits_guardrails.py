"""maxToolRounds / onMaxToolRounds, and guardrails in each onFailure mode."""

from __future__ import annotations

import json
from typing import Any

from stevora.llm.guardrails import Violation, feedback_message
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    openai_text,
    openai_tool_calls,
)
from tests.conftest import Harness
from tests.integration.loop.conftest import (
    SdkProviders,
    anthropic_messages,
    llm_step,
    openai_messages,
    run_workflow,
    tool_def,
)
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency


def _stock_tool(harness: Harness) -> list[int]:
    calls: list[int] = []

    async def check_stock(input: dict[str, Any]) -> dict[str, Any]:
        calls.append(input["sku"])
        return {"sku": input["sku"], "inStock": False}

    harness.tools.register("check_stock", check_stock)
    return calls


def _three_tool_rounds(fake: FakeLLMServer, *, last_text: str | None = None) -> None:
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "check_stock", '{"sku": 1}')], text="Checking sku 1."),
        openai_tool_calls([("call_2", "check_stock", '{"sku": 2}')]),
        openai_tool_calls([("call_3", "check_stock", '{"sku": 3}')], text=last_text),
    )


STOCK_TOOL = tool_def("check_stock", {"sku": {"type": "integer"}}, ["sku"])


async def test_still_asking_for_tools_after_max_tool_rounds_fails_the_step(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    calls = _stock_tool(harness)
    _three_tool_rounds(fake)
    result = await run_workflow(harness, workspace_id, llm_step(tools=[STOCK_TOOL], maxToolRounds=2))

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "MAX_TOOL_ROUNDS"
    assert result.run["error"]["details"] == {"maxToolRounds": 2, "requestedTools": ["check_stock"]}
    assert calls == [1, 2]  # the third request's tool was not executed
    assert [(c["round"], c["status"]) for c in result.llm_calls] == [
        (1, "completed"),
        (2, "completed"),
        (3, "completed"),
    ]
    assert [(t["round"], t["input_json"]) for t in result.traces] == [(1, {"sku": 1}), (2, {"sku": 2})]
    types = result.event_types()
    assert types.count("LLM_CALL_COMPLETED") == 3 and types.count("TOOL_CALL_COMPLETED") == 2
    assert types[-2:] == ["STEP_FAILED", "WORKFLOW_FAILED"]
    assert "STEP_RETRYING" not in types  # not retryable: another attempt would hit the same limit
    (step_failed,) = result.events_of("STEP_FAILED")
    assert step_failed["error"]["code"] == "MAX_TOOL_ROUNDS" and step_failed["error"]["retryable"] is False
    assert len(fake.openai.requests) == 3
    last = openai_messages(fake, 2)
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["call_1", "call_2"]
    await assert_trace_event_consistency(harness, result.id)


async def test_on_max_tool_rounds_complete_keeps_the_last_text(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    calls = _stock_tool(harness)
    _three_tool_rounds(fake, last_text="Nothing is in stock so far.")
    step = llm_step(tools=[STOCK_TOOL], maxToolRounds=2, onMaxToolRounds="complete", outputKey="stock")
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"stock": "Nothing is in stock so far."}
    assert calls == [1, 2]
    output = await harness.rt.pool.fetchval(
        "SELECT output FROM step_runs WHERE id = $1", result.step_runs[0]["id"]
    )
    assert output["stoppedAtMaxToolRounds"] is True
    assert (output["rounds"], output["toolRounds"], output["text"]) == (3, 2, "Nothing is in stock so far.")
    assert result.event_types().count("TOOL_CALL_COMPLETED") == 2
    assert len(fake.openai.requests) == 3
    await assert_trace_event_consistency(harness, result.id)


BLOCKLIST = {"type": "content_safety", "config": {"blocklist": ["guaranteed refund"]}}


async def test_guardrail_block_fails_the_step(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.openai.enqueue(openai_text("You get a Guaranteed Refund, no questions asked."))
    step = llm_step(guardrails={"postChecks": [BLOCKLIST], "onFailure": "block"})
    result = await run_workflow(harness, workspace_id, step)

    violation = {"check": "content_safety", "message": "Response contains blocked term 'guaranteed refund'"}
    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "GUARDRAIL_FAILED"
    assert result.run["error"]["details"] == {"violations": [violation]}
    assert result.state == {}
    (event,) = result.events_of("GUARDRAIL_FAILED")
    assert event == {"stepName": "agent", "round": 1, "action": "block", "violations": [violation]}
    types = result.event_types()
    assert types.index("LLM_CALL_COMPLETED") < types.index("GUARDRAIL_FAILED") < types.index("STEP_FAILED")
    assert "STEP_RETRYING" not in types
    assert len(fake.openai.requests) == 1
    await assert_trace_event_consistency(harness, result.id)


async def test_guardrail_warn_completes_with_warnings(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.openai.enqueue(openai_text("A guaranteed refund is yours."))
    result = await run_workflow(harness, workspace_id, llm_step(guardrails={"postChecks": [BLOCKLIST]}))

    assert result.status == "COMPLETED", result.run["error"]  # onFailure defaults to warn
    assert result.state == {"agent": "A guaranteed refund is yours."}
    (event,) = result.events_of("GUARDRAIL_FAILED")
    assert event["action"] == "warn"
    output = await harness.rt.pool.fetchval(
        "SELECT output FROM step_runs WHERE id = $1", result.step_runs[0]["id"]
    )
    assert output["guardrailWarnings"] == event["violations"]
    assert len(fake.openai.requests) == 1
    await assert_trace_event_consistency(harness, result.id)


RISK_SCHEMA = {"riskScore": {"type": "number"}, "summary": {"type": "string"}}
FEEDBACK_STEP = llm_step(
    model="claude-haiku-4-5",
    messages=[{"role": "user", "content": "Assess the risk of {{input.question}} as JSON."}],
    responseFormat="json",
    outputSchema=RISK_SCHEMA,
    structuredOutput="prompt",  # the check and re-prompts are under test, not the provider's mode
    outputKey="risk",
    guardrails={
        "postChecks": [
            {"type": "schema_validation"},
            {"type": "confidence_threshold", "config": {"min": 0.7}},
        ],
        "onFailure": "retry_with_feedback",
    },
)


async def test_guardrail_retry_with_feedback_reprompts_with_the_failures(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    first = '{"summary": "Looks fine", "confidence": 0.4}'
    fixed = {"riskScore": 0.2, "summary": "Low risk", "confidence": 0.9}
    fake.anthropic.enqueue(anthropic_text(first), anthropic_text(json.dumps(fixed)))
    result = await run_workflow(harness, workspace_id, FEEDBACK_STEP, {"question": "vendor X"})

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"risk": fixed}
    violations = [
        Violation("schema_validation", "missing required field 'riskScore'"),
        Violation("confidence_threshold", "Confidence 0.4 is below the threshold 0.7"),
    ]
    feedback = feedback_message(violations)
    assert feedback == (
        "Your previous answer failed these checks:\n"
        "- schema_validation: missing required field 'riskScore'\n"
        "- confidence_threshold: Confidence 0.4 is below the threshold 0.7\n"
        "Please answer again, fixing every problem."
    )
    (event,) = result.events_of("GUARDRAIL_FAILED")
    assert event == {
        "stepName": "agent",
        "round": 1,
        "action": "retry_with_feedback",
        "violations": [v.to_dict() for v in violations],
    }
    # What the model was sent in the feedback round: its own answer, then the failures.
    assert anthropic_messages(fake, 1) == [
        {"role": "user", "content": [{"type": "text", "text": "Assess the risk of vendor X as JSON."}]},
        {"role": "assistant", "content": [{"type": "text", "text": first}]},
        {"role": "user", "content": [{"type": "text", "text": feedback}]},
    ]
    stored = [c["request"] for c in result.llm_calls]
    assert stored[1]["feedback"] is True
    assert stored[1]["messages"] == [{"role": "user", "content": feedback}]  # only the new message is stored
    assert "feedback" not in stored[0]
    assert result.event_types().count("LLM_CALL_COMPLETED") == 2
    await assert_trace_event_consistency(harness, result.id)


async def test_guardrail_retry_with_feedback_blocks_once_attempts_are_spent(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    bad = '{"summary": "still missing the score", "confidence": 0.9}'
    fake.anthropic.enqueue(anthropic_text(bad), anthropic_text(bad))
    step = json.loads(json.dumps(FEEDBACK_STEP))
    step["guardrails"]["maxFeedbackAttempts"] = 1
    result = await run_workflow(harness, workspace_id, step, {"question": "vendor Y"})

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "GUARDRAIL_FAILED"
    assert [e["action"] for e in result.events_of("GUARDRAIL_FAILED")] == ["retry_with_feedback", "block"]
    assert [e["round"] for e in result.events_of("GUARDRAIL_FAILED")] == [1, 2]
    assert len(fake.anthropic.requests) == 2
    assert len(result.completed_calls()) == 2
    await assert_trace_event_consistency(harness, result.id)
