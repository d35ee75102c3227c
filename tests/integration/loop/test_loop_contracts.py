"""Contracts of the tool loop that its mutation run found unpinned (docs/testing.md, "Mutation
testing"): what each checkpoint records and what the loop answers at its edges, asserted on rows,
events and the requests the providers received."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stevora.llm.messages import Usage
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    error,
    openai_text,
    openai_tool_calls,
)
from stevora.testing.fake_prompt_cache import without_cache_markers
from stevora.tools import ToolContext
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow, tool_def
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency

STOCK_TOOL = tool_def("check_stock", {"sku": {"type": "integer"}}, ["sku"])


def _stock_tool(harness: Harness) -> None:
    async def check_stock(input: dict[str, Any]) -> dict[str, Any]:
        return {"sku": input["sku"], "inStock": False}

    harness.tools.register("check_stock", check_stock)


async def _step_output(harness: Harness, step_run_id: str) -> dict[str, Any]:
    return dict(await harness.rt.pool.fetchval("SELECT output FROM step_runs WHERE id = $1", step_run_id))


@pytest.mark.parametrize("first_text", ["Checking sku 1.", None])
async def test_complete_at_max_tool_rounds_answers_with_the_latest_text_the_model_wrote(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, first_text: str | None
) -> None:
    """The text comes from the model's own turns, never from a tool result, even when its last
    turns carried none; a model that never wrote any text answers ""."""
    _stock_tool(harness)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "check_stock", '{"sku": 1}')], text=first_text),
        openai_tool_calls([("call_2", "check_stock", '{"sku": 2}')]),
        openai_tool_calls([("call_3", "check_stock", '{"sku": 3}')]),
    )
    step = llm_step(tools=[STOCK_TOOL], maxToolRounds=2, onMaxToolRounds="complete", outputKey="stock")
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"stock": first_text or ""}
    output = await _step_output(harness, result.step_runs[0]["id"])
    assert (output["text"], output["stoppedAtMaxToolRounds"]) == (first_text or "", True)
    assert (output["rounds"], output["toolRounds"]) == (3, 2)
    assert len(result.traces) == 2  # the over-limit round's call was not executed
    await assert_trace_event_consistency(harness, result.id)


async def test_max_tool_rounds_failure_says_how_many_rounds_the_model_had(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    _stock_tool(harness)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "check_stock", '{"sku": 1}')]),
        openai_tool_calls([("call_2", "check_stock", '{"sku": 2}'), ("call_3", "lookup", "{}")]),
    )
    step = llm_step(tools=[STOCK_TOOL, tool_def("lookup")], maxToolRounds=1)
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "MAX_TOOL_ROUNDS"
    assert result.run["error"]["message"] == "The model still asked for tools after 1 tool rounds"
    assert result.run["error"]["details"] == {"maxToolRounds": 1, "requestedTools": ["check_stock", "lookup"]}
    (step_failed,) = result.events_of("STEP_FAILED")
    assert step_failed["error"]["message"] == "The model still asked for tools after 1 tool rounds"


async def test_handler_calls_see_the_run_and_record_their_state_updates(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """A handler sees the run's input and the state as the step's earlier calls left it (calls
    run one by one here); its updates are recorded with its trace row and event, a failed
    call's are not."""
    seen: list[dict[str, Any]] = []

    async def note(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        seen.append(
            {
                "run": ctx.workflow_run_id,
                "workspace": ctx.workspace_id,
                "stepRun": ctx.step_run_id,
                "step": ctx.step_name,
                "input": dict(ctx.run_input),
                "state": dict(ctx.state),
            }
        )
        ctx.update_state({"notes": [*ctx.state.get("notes", []), input["text"]], "last": input["text"]})
        if input["text"] == "boom":
            raise RuntimeError("notebook is full")
        return {"saved": input["text"]}

    harness.tools.register("note", note)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "note", '{"text": "a"}'), ("call_2", "note", '{"text": "b"}')]),
        openai_tool_calls([("call_3", "note", '{"text": "boom"}')]),
        openai_text("Noted."),
    )
    note_tool = tool_def("note", {"text": {"type": "string"}}, ["text"])
    result = await run_workflow(
        harness,
        workspace_id,
        llm_step(name="scribe", tools=[note_tool], parallelToolCalls=False),
        {"question": "Q?", "user": "u1"},
    )

    assert result.status == "COMPLETED", result.run["error"]
    step_run_id = result.step_runs[0]["id"]
    assert [(s["run"], s["workspace"], s["stepRun"], s["step"]) for s in seen] == [
        (result.id, workspace_id, step_run_id, "scribe")
    ] * 3
    assert [s["input"] for s in seen] == [{"question": "Q?", "user": "u1"}] * 3
    assert [s["state"] for s in seen] == [
        {},
        {"notes": ["a"], "last": "a"},
        {"notes": ["a", "b"], "last": "b"},
    ]
    # The failed third call's updates were dropped; the answer lands beside the tools' state.
    assert result.state == {"notes": ["a", "b"], "last": "b", "scribe": "Noted."}

    calls_by_round = {c["round"]: c["id"] for c in result.llm_calls}
    completed = result.events_of("TOOL_CALL_COMPLETED")
    assert [e["stateKeys"] for e in completed] == [["last", "notes"], ["last", "notes"]]
    for event, trace in zip(completed, result.traces[:2], strict=True):
        assert event == {
            "toolTraceId": trace["id"],
            "llmCallId": calls_by_round[1],
            "toolName": "note",
            "toolCallId": trace["tool_call_id"],
            "round": 1,
            "sequence": trace["sequence"],
            "durationMs": round(trace["duration_ms"], 3),
            "stateKeys": ["last", "notes"],
        }
        assert trace["status"] == "completed" and trace["result_text"] is None
        assert trace["output_json"] == {"saved": trace["input_json"]["text"]}
        assert trace["llm_call_id"] == calls_by_round[1] and trace["step_run_id"] == step_run_id

    (failed,) = result.events_of("TOOL_CALL_FAILED")
    failed_trace = result.traces[2]
    assert failed == {
        "toolTraceId": failed_trace["id"],
        "llmCallId": calls_by_round[2],
        "toolName": "note",
        "toolCallId": "call_3",
        "round": 2,
        "sequence": 0,
        "durationMs": round(failed_trace["duration_ms"], 3),
        "error": "RuntimeError: notebook is full",
        "errorCode": "TOOL_ERROR",
    }
    assert failed_trace["idempotency_key"] == f"{step_run_id}:2:0"
    await assert_trace_event_consistency(harness, result.id)


async def test_each_model_call_is_recorded_with_its_request_response_usage_and_cost(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    _stock_tool(harness)
    cache = {"cache_read_input_tokens": 300, "cache_creation_input_tokens": 40}
    fake.anthropic.enqueue(
        anthropic_tool_use(
            [("toolu_1", "check_stock", {"sku": 7})],
            text="Let me check.",
            usage={"input_tokens": 100, "output_tokens": 20, **cache},
        ),
        anthropic_text("Sku 7 is out of stock.", usage={"input_tokens": 200, "output_tokens": 9}),
    )
    step = llm_step(
        model="claude-haiku-4-5",
        systemPrompt="Be brief.",
        tools=[STOCK_TOOL],
        temperature=0.25,
        maxTokens=300,
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    first, second = result.llm_calls
    # Only the messages new to each call are stored: the prompt with the first, nothing with the
    # second (its tool results are the trace rows).
    assert first["request"] == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello?"},
        ],
        "model": "claude-haiku-4-5",
        "tools": ["check_stock"],
        "temperature": 0.25,
        "maxTokens": 300,
        "responseFormat": None,
    }
    assert second["request"] == {**first["request"], "messages": []}
    assert (first["round"], second["round"]) == (1, 2)
    assert 0 < first["time_to_first_token_ms"] <= first["duration_ms"]
    assert (first["step_name"], first["provider"], first["status"]) == ("agent", "anthropic", "completed")
    assert first["response"]["text"] == "Let me check."
    assert first["response"]["toolCalls"] == [
        {"id": "toolu_1", "name": "check_stock", "arguments": '{"sku":7}'}
    ]
    assert first["response"]["responseModel"] == "claude-haiku-4-5"
    assert first["response"]["responseId"].startswith("msg_fake")
    assert first["response"]["priced"] is True and first["finish_reason"] == "tool_calls"
    assert (first["input_tokens"], first["output_tokens"]) == (440, 20)
    assert (first["cache_read_tokens"], first["cache_write_tokens"]) == (300, 40)
    expected_cost = harness.rt.pricing.cost_usd(
        "anthropic", "claude-haiku-4-5", Usage(440, 20, cache_read_tokens=300, cache_write_tokens=40)
    )
    assert expected_cost is not None and first["cost_usd"] == pytest.approx(expected_cost)
    # Cache reads are billed below the input rate: the cache counts reached the price.
    assert first["cost_usd"] != pytest.approx(
        harness.rt.pricing.cost_usd("anthropic", "claude-haiku-4-5", Usage(440, 20))
    )

    (event_1, event_2) = result.events_of("LLM_CALL_COMPLETED")
    assert event_1 == {
        "llmCallId": first["id"],
        "model": "claude-haiku-4-5",
        "provider": "anthropic",
        "round": 1,
        "inputTokens": 440,
        "outputTokens": 20,
        "cacheReadTokens": 300,
        "cacheWriteTokens": 40,
        "reasoningTokens": 0,
        "costUsd": first["cost_usd"],
        "durationMs": round(first["duration_ms"], 3),
        # Streamed (the default): the first delta's time, stored on the row and in the event.
        "timeToFirstTokenMs": round(first["time_to_first_token_ms"], 3),
        "toolCalls": ["check_stock"],
        "finishReason": "tool_calls",
    }
    assert (event_2["round"], event_2["toolCalls"], event_2["finishReason"]) == (2, [], "stop")

    output = await _step_output(harness, result.step_runs[0]["id"])
    assert output["usage"] == {"inputTokens": 640, "outputTokens": 29}
    assert output["costUsd"] == pytest.approx(first["cost_usd"] + second["cost_usd"])
    assert (output["rounds"], output["toolRounds"]) == (2, 1)
    sent = fake.anthropic.requests[0].json
    assert (sent["temperature"], sent["max_tokens"]) == (0.25, 300)


async def test_a_retried_step_rebuilds_its_transcript_usage_and_cost_from_the_committed_rounds(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """Attempt 2 continues from attempt 1's rows: the model gets the same conversation (a failed
    call's result still marked as an error) and the step's totals count both attempts' calls."""
    _stock_tool(harness)

    async def reserve(input: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("warehouse offline")

    harness.tools.register("reserve", reserve)
    fake.anthropic.enqueue(
        anthropic_tool_use(
            [("toolu_1", "check_stock", {"sku": 7}), ("toolu_2", "reserve", {})],
            text="Checking.",
            usage={"input_tokens": 100, "output_tokens": 20},
        ),
        error(503, "overloaded"),  # attempt 1 fails on its second model call
        anthropic_text("Sku 7: none left.", usage={"input_tokens": 300, "output_tokens": 7}),
    )
    step = llm_step(
        model="claude-haiku-4-5",
        tools=[STOCK_TOOL, tool_def("reserve")],
        retry={"maxAttempts": 2, "backoffMs": 100},
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert [s["status"] for s in result.step_runs] == ["FAILED", "COMPLETED"]
    assert [(c["round"], c["status"]) for c in result.llm_calls] == [
        (1, "completed"),
        (2, "failed"),
        (2, "completed"),
    ]
    failed_call, resumed = fake.anthropic.requests[1].json, fake.anthropic.requests[2].json
    assert resumed["messages"] == failed_call["messages"]
    assert without_cache_markers(resumed)["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"sku": 7, "inStock": false}'},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": '{"error": "warehouse offline"}',
                "is_error": True,
            },
        ],
    }
    output = await _step_output(harness, result.step_runs[1]["id"])
    assert output["text"] == "Sku 7: none left."
    assert (output["rounds"], output["toolRounds"]) == (2, 1)
    assert output["usage"] == {"inputTokens": 400, "outputTokens": 27}
    completed = result.completed_calls()
    assert output["costUsd"] == pytest.approx(sum(c["cost_usd"] for c in completed)) and output["costUsd"] > 0
    assert len(result.traces) == 2  # attempt 2 ran no tool again


async def test_a_tools_own_timeout_and_output_schema_bound_its_handler(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """`timeoutMs` on a declared tool overrides the step's `toolTimeoutMs`; its inline
    `outputSchema` turns a result that does not match into a failed call."""

    async def slow(input: dict[str, Any]) -> str:
        await asyncio.sleep(3)
        return "late"

    async def quote(input: dict[str, Any]) -> dict[str, Any]:
        return {"price": "cheap"}

    harness.tools.register("slow", slow)
    harness.tools.register("quote", quote)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "slow", "{}"), ("call_2", "quote", "{}")]),
        openai_text("Both failed."),
    )
    tools = [
        {**tool_def("slow"), "timeoutMs": 150},
        {
            **tool_def("quote"),
            "outputSchema": {"type": "object", "properties": {"price": {"type": "number"}}},
        },
    ]
    result = await run_workflow(harness, workspace_id, llm_step(tools=tools, toolTimeoutMs=20_000))

    assert result.status == "COMPLETED", result.run["error"]
    slow_trace, quote_trace = result.traces
    assert (slow_trace["error_code"], slow_trace["error"]) == (
        "TOOL_TIMEOUT",
        "Tool 'slow' timed out after 0.15s",
    )
    assert 150 <= slow_trace["duration_ms"] < 2500
    assert quote_trace["status"] == "failed" and quote_trace["error_code"] == "TOOL_OUTPUT_INVALID"


async def test_after_a_failover_later_rounds_stay_on_the_fallback_model(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    _stock_tool(harness)
    fake.openai.enqueue(error(500, "primary down"))
    fake.anthropic.enqueue(
        anthropic_tool_use([("toolu_1", "check_stock", {"sku": 1})]),
        anthropic_text("None in stock."),
    )
    step = llm_step(tools=[STOCK_TOOL], fallbackModels=["claude-haiku-4-5"], retry={"maxAttempts": 1})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert [(c["round"], c["model"], c["status"]) for c in result.llm_calls] == [
        (1, "gpt-4o-mini", "failed"),
        (1, "claude-haiku-4-5", "completed"),
        (2, "claude-haiku-4-5", "completed"),
    ]
    assert len(fake.openai.requests) == 1  # round 2 did not pay for the primary's failure again
    (failed,) = result.events_of("LLM_CALL_FAILED")
    failed_row = result.llm_calls[0]
    assert failed == {
        "llmCallId": failed_row["id"],
        "model": "gpt-4o-mini",
        "provider": "openai",
        "round": 1,
        "error": failed_row["error"],
        "durationMs": round(failed_row["duration_ms"], 3),
    }
    assert failed_row["error"]["retryable"] is True and failed_row["step_name"] == "agent"
    assert failed_row["request"]["model"] == "gpt-4o-mini"
    assert result.llm_calls[1]["request"]["model"] == "claude-haiku-4-5"
