"""Where the answer lands (outputKey, JSON results), what a run costs, and how much is stored."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stevora.llm.structured import schema_instruction
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    openai_text,
    openai_tool_calls,
)
from stevora.testing.fake_prompt_cache import without_cache_markers
from tests.conftest import Harness
from tests.integration.loop.conftest import (
    SdkProviders,
    anthropic_system,
    llm_step,
    openai_messages,
    run_workflow,
    tool_def,
)
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency

SENTIMENT_SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["sentiment", "score"],
}


async def test_json_answer_matching_the_output_schema_lands_in_state_under_output_key(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    answer = 'Sure! Here it is:\n```json\n{"sentiment": "positive", "score": 0.92}\n```\nAnything else?'
    fake.openai.enqueue(openai_text(answer))
    step = llm_step(
        messages=[{"role": "user", "content": "Classify: {{input.question}}"}],
        responseFormat="json",
        outputSchema=SENTIMENT_SCHEMA,
        structuredOutput="prompt",  # an answer in prose: what the prompt form has to parse
        outputKey="classification",
    )
    result = await run_workflow(harness, workspace_id, step, {"question": "I love it"})

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"classification": {"sentiment": "positive", "score": 0.92}}
    output = await harness.rt.pool.fetchval(
        "SELECT output FROM step_runs WHERE id = $1", result.step_runs[0]["id"]
    )
    assert output["json"] == {"sentiment": "positive", "score": 0.92}
    assert output["text"] == answer
    assert "GUARDRAIL_FAILED" not in result.event_types() and result.traces == []
    assert result.events_of("LLM_CALL_COMPLETED")[0]["finishReason"] == "stop"
    (request,) = fake.openai.requests
    assert request.json["response_format"] == {"type": "json_object"}
    # The prompt form says the schema (and "JSON", which OpenAI's json_object mode requires).
    assert request.json["messages"][0] == {"role": "system", "content": schema_instruction(SENTIMENT_SCHEMA)}
    assert result.llm_calls[0]["request"]["responseFormat"] == "json"
    await assert_trace_event_consistency(harness, result.id)


async def test_json_answer_violating_the_output_schema_blocks_without_guardrail_config(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.anthropic.enqueue(anthropic_text('{"sentiment": "ecstatic", "score": 0.92}'))
    step = llm_step(
        model="claude-haiku-4-5",
        responseFormat="json",
        outputSchema=SENTIMENT_SCHEMA,
        structuredOutput="prompt",
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "GUARDRAIL_FAILED"
    (event,) = result.events_of("GUARDRAIL_FAILED")
    assert event["action"] == "block"
    assert event["violations"][0]["check"] == "output_schema"
    assert event["violations"][0]["message"].startswith("sentiment: 'ecstatic' is not one of")
    assert anthropic_system(fake, 0) == schema_instruction(SENTIMENT_SCHEMA)  # said in the prompt
    await assert_trace_event_consistency(harness, result.id)


@pytest.mark.parametrize("output_key", [None, "reply"])
async def test_text_answer_lands_under_output_key_defaulting_to_the_step_name(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, output_key: str | None
) -> None:
    fake.anthropic.enqueue(anthropic_text("Plain text answer."))
    step = llm_step(model="claude-haiku-4-5", name="draft-reply")
    if output_key:
        step["outputKey"] = output_key
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {output_key or "draft-reply": "Plain text answer."}
    assert result.run["output"] == result.state  # the run's output is its final state
    assert result.traces == [] and result.event_types().count("LLM_CALL_COMPLETED") == 1
    (request,) = fake.anthropic.requests
    assert without_cache_markers(request.json)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hello?"}]}
    ]
    assert "system" not in request.json and "tools" not in request.json
    await assert_trace_event_consistency(harness, result.id)


GPT_4O_MINI_IN, GPT_4O_MINI_OUT = 0.15, 0.60  # USD per million tokens


async def test_total_cost_cents_is_the_sum_of_llm_call_costs(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    harness.tools.register("lookup", lambda input: {"found": True})
    usages = [(1000, 500), (2000, 40), (3000, 700)]
    fake.openai.enqueue(
        openai_tool_calls(
            [("call_1", "lookup", "{}")], usage={"prompt_tokens": 1000, "completion_tokens": 500}
        ),
        openai_tool_calls(
            [("call_2", "lookup", "{}")], usage={"prompt_tokens": 2000, "completion_tokens": 40}
        ),
        openai_text("Done.", usage={"prompt_tokens": 3000, "completion_tokens": 700}),
    )
    result = await run_workflow(harness, workspace_id, llm_step(tools=[tool_def("lookup")]))

    assert result.status == "COMPLETED", result.run["error"]
    expected = [(i * GPT_4O_MINI_IN + o * GPT_4O_MINI_OUT) / 1_000_000 for i, o in usages]
    assert [c["cost_usd"] for c in result.llm_calls] == pytest.approx(expected)
    assert [(c["input_tokens"], c["output_tokens"]) for c in result.llm_calls] == usages
    assert all(c["response"]["priced"] is True for c in result.llm_calls)
    total_usd = sum(c["cost_usd"] for c in result.llm_calls)
    assert result.run["total_cost_cents"] == pytest.approx(total_usd * 100)
    assert result.run["total_cost_cents"] == pytest.approx(sum(expected) * 100)
    assert result.run["total_input_tokens"] == 6000 and result.run["total_output_tokens"] == 1240
    assert [e["costUsd"] for e in result.events_of("LLM_CALL_COMPLETED")] == pytest.approx(expected)
    output = await harness.rt.pool.fetchval(
        "SELECT output FROM step_runs WHERE id = $1", result.step_runs[0]["id"]
    )
    assert output["costUsd"] == pytest.approx(total_usd)
    assert output["usage"] == {"inputTokens": 6000, "outputTokens": 1240}
    await assert_trace_event_consistency(harness, result.id)


async def test_stored_requests_grow_linearly_not_quadratically(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """A 6-round loop: the prompt is stored once, later calls store no repeated history."""
    page = "lorem ipsum " * 200  # ~2.4 KB per tool result

    async def read_page(input: dict[str, Any]) -> str:
        return f"page {input['n']}: {page}"

    harness.tools.register("read_page", read_page)
    prompt = "Summarise the report. " + "Context: " + "x" * 4000
    fake.openai.enqueue(
        *(openai_tool_calls([(f"call_{n}", "read_page", json.dumps({"n": n}))]) for n in range(1, 6)),
        openai_text("Summary."),
    )
    step = llm_step(
        messages=[{"role": "user", "content": prompt}],
        tools=[tool_def("read_page", {"n": {"type": "integer"}})],
        maxToolRounds=5,
    )
    result = await run_workflow(harness, workspace_id, step)
    assert result.status == "COMPLETED", result.run["error"]
    assert len(result.llm_calls) == 6 and len(result.traces) == 5

    sizes = await harness.rt.pool.fetch(
        "SELECT round, octet_length(request::text) AS size, request FROM llm_calls "
        "WHERE workflow_run_id = $1 ORDER BY round",
        result.id,
    )
    first, later = sizes[0], sizes[1:]
    assert first["request"]["messages"] == [{"role": "user", "content": prompt}]
    assert first["size"] > len(prompt)
    assert all(row["request"]["messages"] == [] for row in later)
    assert len({row["size"] for row in later}) == 1  # every later request costs the same bytes
    assert later[0]["size"] < 400
    total = sum(row["size"] for row in sizes)
    assert total < first["size"] + 5 * 400
    # ... while what the model received did grow: the last request carried every page.
    last_request = openai_messages(fake, 5)
    assert sum(1 for m in last_request if m["role"] == "tool") == 5
    assert len(json.dumps(last_request)) > 5 * len(page)
    # Each tool result is stored once, in its trace row.
    stored_results = await harness.rt.pool.fetchval(
        "SELECT sum(octet_length(output_json::text)) FROM tool_trace WHERE workflow_run_id = $1", result.id
    )
    assert 5 * len(page) < stored_results < 6 * len(page)
    await assert_trace_event_consistency(harness, result.id)
