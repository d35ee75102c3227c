"""Provider failures mid-loop: fallback to another provider from the committed transcript, SDK
retries on 429 with retry-after-ms, and step retries that resume the loop."""

from __future__ import annotations

from typing import Any

from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    error,
    openai_text,
    openai_tool_calls,
)
from tests.conftest import Harness
from tests.integration.loop.conftest import (
    SdkProviders,
    anthropic_messages,
    anthropic_system,
    error_json,
    llm_step,
    openai_messages,
    run_workflow,
    tool_def,
)
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency

TOOLS = [tool_def("search_kb", {"query": {"type": "string"}}, ["query"]), tool_def("get_customer")]


def _register(harness: Harness) -> dict[str, int]:
    runs = {"search_kb": 0, "get_customer": 0}

    async def search_kb(input: dict[str, Any]) -> list[str]:
        runs["search_kb"] += 1
        return [f"article about {input['query']}"]

    async def get_customer(input: dict[str, Any]) -> dict[str, Any]:
        runs["get_customer"] += 1
        raise LookupError("no such customer")

    harness.tools.register("search_kb", search_kb)
    harness.tools.register("get_customer", get_customer)
    return runs


ROUND_ONE = openai_tool_calls(
    [("call.1:kb", "search_kb", '{"query": "refunds"}'), ("call_B2", "get_customer", "{}")]
)


async def test_fallback_model_continues_the_loop_from_the_committed_transcript(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    runs = _register(harness)
    fake.openai.enqueue(ROUND_ONE, error(500, "upstream exploded"))
    fake.anthropic.enqueue(
        anthropic_text("Refunds: see the article. Customer unknown.", model="claude-haiku-4-5")
    )
    step = llm_step(
        systemPrompt="Be brief.", tools=TOOLS, fallbackModels=["claude-haiku-4-5"], retry={"maxAttempts": 1}
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": "Refunds: see the article. Customer unknown."}
    assert runs == {"search_kb": 1, "get_customer": 1}  # round-1 tools were not executed again
    assert [(c["round"], c["provider"], c["model"], c["status"]) for c in result.llm_calls] == [
        (1, "openai", "gpt-4o-mini", "completed"),
        (2, "openai", "gpt-4o-mini", "failed"),
        (2, "anthropic", "claude-haiku-4-5", "completed"),
    ]
    failed_call = result.llm_calls[1]
    assert failed_call["error"]["code"] == "LLM_PROVIDER_ERROR" and failed_call["error"]["retryable"] is True
    assert failed_call["error"]["details"]["statusCode"] == 500
    assert "upstream exploded" in failed_call["error"]["message"]
    assert failed_call["response"] is None and failed_call["cost_usd"] == 0
    types = result.event_types()
    assert types.count("LLM_CALL_FAILED") == 1 and types.count("LLM_CALL_COMPLETED") == 2
    assert types.index("LLM_CALL_FAILED") < len(types) - types[::-1].index("LLM_CALL_COMPLETED") - 1
    (failed_event,) = result.events_of("LLM_CALL_FAILED")
    assert failed_event["llmCallId"] == failed_call["id"] and failed_event["provider"] == "openai"
    assert failed_event["round"] == 2 and failed_event["error"]["details"]["statusCode"] == 500

    # Anthropic got the whole conversation so far, rebuilt from the committed rows, with the
    # non-portable OpenAI id "call.1:kb" normalised on both the tool_use and its tool_result.
    (request,) = fake.anthropic.requests
    assert anthropic_system(fake, 0) == "Be brief."
    assert request.json["model"] == "claude-haiku-4-5"
    assert anthropic_messages(fake, 0) == [
        {"role": "user", "content": [{"type": "text", "text": "Hello?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_1_0", "name": "search_kb", "input": {"query": "refunds"}},
                {"type": "tool_use", "id": "call_B2", "name": "get_customer", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1_0", "content": '["article about refunds"]'},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_B2",
                    "content": error_json("no such customer"),
                    "is_error": True,
                },
            ],
        },
    ]
    # The failed OpenAI round-2 request carried the same history (ids normalised for OpenAI too).
    assert [m.get("tool_call_id") for m in openai_messages(fake, 1) if m["role"] == "tool"] == [
        "call_1_0",
        "call_B2",
    ]
    assert [t["tool_call_id"] for t in result.traces] == [
        "call.1:kb",
        "call_B2",
    ]  # traces keep the original ids
    output = await harness.rt.pool.fetchval(
        "SELECT output FROM step_runs WHERE id = $1", result.step_runs[0]["id"]
    )
    assert (output["provider"], output["model"]) == ("anthropic", "claude-haiku-4-5")
    await assert_trace_event_consistency(harness, result.id)


async def test_rate_limit_with_retry_after_ms_is_retried_by_the_sdk(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    runs = _register(harness)
    sdk.openai(max_retries=2)  # replaces the retry-less provider
    fake.openai.enqueue(
        error(429, "Rate limit reached", retry_after_ms=50),
        openai_tool_calls([("call_1", "search_kb", '{"query": "plans"}')]),
        error(429, "Rate limit reached", retry_after_ms=50),
        error(429, "Rate limit reached", retry_after_ms=50),
        openai_text("Here are the plans."),
    )
    result = await run_workflow(harness, workspace_id, llm_step(tools=TOOLS))

    assert result.status == "COMPLETED", result.run["error"]
    assert runs["search_kb"] == 1
    requests = fake.openai.requests
    assert len(requests) == 5
    assert [r.headers.get("x-stainless-retry-count") for r in requests] == ["0", "1", "0", "1", "2"]
    assert requests[0].json == requests[1].json and requests[2].json == requests[4].json
    # The retries happened inside the SDK: no failed llm_calls rows, no LLM_CALL_FAILED events.
    assert [(c["round"], c["status"]) for c in result.llm_calls] == [(1, "completed"), (2, "completed")]
    assert "LLM_CALL_FAILED" not in result.event_types()
    assert "STEP_RETRYING" not in result.event_types()
    assert [t["status"] for t in result.traces] == ["completed"]
    await assert_trace_event_consistency(harness, result.id)


async def test_retryable_provider_failure_retries_the_step_and_resumes_the_loop(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    runs = _register(harness)
    sdk.openai(max_retries=1)
    fake.openai.enqueue(
        ROUND_ONE,
        error(503, "overloaded"),
        error(503, "overloaded"),  # the SDK's one retry fails too: attempt 1 of the step fails
        openai_text("Resumed and answered."),
    )
    step = llm_step(tools=TOOLS, retry={"maxAttempts": 3, "backoffMs": 100})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert result.state == {"agent": "Resumed and answered."}
    assert runs == {"search_kb": 1, "get_customer": 1}  # committed tool calls were not re-run
    first, second = result.step_runs
    assert (first["attempt"], first["status"], second["attempt"], second["status"]) == (
        1,
        "FAILED",
        2,
        "COMPLETED",
    )
    assert first["error"]["code"] == "LLM_PROVIDER_ERROR" and first["error"]["retryable"] is True
    assert [(c["round"], c["status"], c["step_run_id"]) for c in result.llm_calls] == [
        (1, "completed", first["id"]),
        (2, "failed", first["id"]),
        (2, "completed", second["id"]),
    ]
    assert {t["step_run_id"] for t in result.traces} == {first["id"]}
    types = result.event_types()
    assert types.count("STEP_RETRYING") == 1 and types.count("LLM_CALL_FAILED") == 1
    assert types.index("LLM_CALL_FAILED") < types.index("STEP_FAILED") < types.index("STEP_RETRYING")
    (retrying,) = result.events_of("STEP_RETRYING")
    assert (retrying["attempt"], retrying["nextAttempt"], retrying["maxAttempts"]) == (1, 2, 3)
    assert retrying["error"]["code"] == "LLM_PROVIDER_ERROR"
    assert types[types.index("STEP_RETRYING") + 1 :] == [
        "STEP_STARTED",
        "LLM_CALL_COMPLETED",
        "STEP_COMPLETED",
        "WORKFLOW_COMPLETED",
    ]

    requests = fake.openai.requests
    assert len(requests) == 4
    # Attempt 2 sent exactly the conversation attempt 1 had built, rebuilt from the database
    # (including the failed tool's error result).
    assert requests[3].json["messages"] == requests[1].json["messages"]
    tool_results = [m for m in openai_messages(fake, 3) if m["role"] == "tool"]
    assert [m["content"] for m in tool_results] == [
        '["article about refunds"]',
        error_json("no such customer"),
    ]
    await assert_trace_event_consistency(harness, result.id)


async def test_provider_failing_on_every_attempt_fails_the_run(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.openai.enqueue(error(502, "bad gateway"), error(502, "bad gateway"))
    result = await run_workflow(harness, workspace_id, llm_step(retry={"maxAttempts": 2, "backoffMs": 100}))

    assert result.status == "FAILED"
    error_body = result.run["error"]
    assert error_body["code"] == "LLM_PROVIDER_ERROR" and error_body["attempts"] == 2
    assert error_body["message"].startswith("All models failed; last error: openai returned HTTP 502")
    assert [(c["round"], c["status"]) for c in result.llm_calls] == [(1, "failed"), (1, "failed")]
    types = result.event_types()
    assert types.count("LLM_CALL_FAILED") == 2 and types.count("STEP_RETRYING") == 1
    assert types[-2:] == ["STEP_FAILED", "WORKFLOW_FAILED"]
    assert len(fake.openai.requests) == 2
    assert fake.openai.requests[0].json == fake.openai.requests[1].json
    await assert_trace_event_consistency(harness, result.id)


async def test_unconfigured_fallback_does_not_hide_a_retryable_provider_failure(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.openai.enqueue(error(503, "overloaded"), openai_text("Second attempt worked."))
    step = llm_step(fallbackModels=["mistral-large-latest"], retry={"maxAttempts": 2, "backoffMs": 100})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    (retrying,) = result.events_of("STEP_RETRYING")
    assert retrying["error"]["code"] == "LLM_PROVIDER_ERROR"
    assert retrying["error"]["details"]["statusCode"] == 503
    assert [(c["provider"], c["status"]) for c in result.llm_calls] == [
        ("openai", "failed"),
        ("openai", "completed"),
    ]
    assert result.state == {"agent": "Second attempt worked."}
    assert result.event_types().count("LLM_CALL_FAILED") == 1 and result.traces == []
    assert len(fake.openai.requests) == 2 and fake.anthropic.requests == []
    await assert_trace_event_consistency(harness, result.id)


async def test_after_failing_over_later_rounds_stay_on_the_fallback_model(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    runs = _register(harness)
    fake.openai.enqueue(error(500, "primary is down"))
    fake.anthropic.enqueue(
        anthropic_tool_use([("toolu_1", "search_kb", {"query": "refunds"})], model="claude-haiku-4-5"),
        anthropic_text("Done.", model="claude-haiku-4-5"),
    )
    step = llm_step(tools=TOOLS, fallbackModels=["claude-haiku-4-5"], retry={"maxAttempts": 1})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert runs["search_kb"] == 1
    # Round 2 went straight to the model that answered round 1: the primary was called once.
    assert [(c["round"], c["provider"], c["status"]) for c in result.llm_calls] == [
        (1, "openai", "failed"),
        (1, "anthropic", "completed"),
        (2, "anthropic", "completed"),
    ]
    assert sum(1 for r in fake.requests if r.path.endswith("/chat/completions")) == 1
    await assert_trace_event_consistency(harness, result.run["id"])
