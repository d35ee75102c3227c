"""Real runs against llama-cpp-python's OpenAI-compatible server running SmolLM2-135M-Instruct.

A 135M model is not asked to decide anything that matters: forced tool choice (`toolChoice:
{"name": ...}`) makes the first call of a step a tool call, temperature 0 makes every answer
repeatable, and the assertions are about what Stevora sent, recorded and executed.
"""

from __future__ import annotations

from typing import Any

from stevora.llm.capabilities import ServerCapabilities
from tests.interop.conftest import MODEL, PRICE, Interop

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CITY = {
    "name": "get_city",
    "description": "The user's home city",
    "parameters": {"type": "object", "properties": {}},
}


def llm_step(**fields: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "type": "llm",
        "name": "ask",
        "model": MODEL,
        "provider": "llamacpp",
        "temperature": 0,
        "maxTokens": 48,
        "messages": [{"role": "user", "content": "{{input.question}}"}],
        "retry": {"maxAttempts": 1},
    }
    step.update(fields)
    return step


def register(env: Interop, name: str, result: dict[str, Any], seen: list[dict[str, Any]]) -> None:
    async def handler(input: dict[str, Any]) -> dict[str, Any]:
        seen.append(input)
        return result

    env.harness.tools.register(name, handler)


async def test_plain_answer_records_the_servers_token_usage_and_its_configured_price(
    interop: Interop,
) -> None:
    out = await interop.run([llm_step()], {"question": "Say hello in one word."})

    assert out["run"]["status"] == "COMPLETED", out["run"]["error"]
    assert isinstance(out["run"]["state"]["ask"], str) and out["run"]["state"]["ask"].strip()
    [call] = out["calls"]
    assert call["status"] == "completed" and call["provider"] == "llamacpp" and call["model"] == MODEL
    assert call["inputTokens"] > 0 and call["outputTokens"] > 0  # from the server's `usage`
    expected_usd = (call["inputTokens"] * PRICE[0] + call["outputTokens"] * PRICE[1]) / 1_000_000
    assert abs(call["costUsd"] - expected_usd) < 1e-9
    assert abs(out["run"]["totalCostCents"] - expected_usd * 100) < 1e-6


async def test_forced_tool_call_runs_the_handler_once_and_the_run_completes(interop: Interop) -> None:
    seen: list[dict[str, Any]] = []
    register(interop, "get_weather", {"temp_c": 21, "sky": "sunny"}, seen)
    step = llm_step(tools=[WEATHER], toolChoice={"name": "get_weather"})
    out = await interop.run([step], {"question": "What is the weather in Paris?"})

    assert out["run"]["status"] == "COMPLETED", out["run"]["error"]
    assert len(seen) == 1 and isinstance(seen[0].get("city"), str)
    [trace] = out["traces"]
    assert trace["toolName"] == "get_weather" and trace["status"] == "completed"
    assert trace["outputJson"] == {"temp_c": 21, "sky": "sunny"}
    assert out["events"].count("TOOL_CALL_COMPLETED") == 1
    # The result went back: a second model call, with the tool-call turn the server accepted.
    assert [c["status"] for c in out["calls"]] == ["completed", "completed"]
    assert out["calls"][1]["finishReason"] == "stop"
    assert isinstance(out["run"]["state"]["ask"], str)


async def test_two_tool_rounds_each_run_their_handler_once(interop: Interop) -> None:
    seen: list[dict[str, Any]] = []
    register(interop, "get_city", {"city": "Paris"}, seen)
    register(interop, "get_weather", {"temp_c": 21, "sky": "sunny"}, seen)
    step = llm_step(
        provider="llamacpp-auto",  # sends tool_choice "auto" after the forced first call
        tools=[CITY, WEATHER],
        toolChoice={"name": "get_city"},
        # A 135M model offered tools keeps calling them; stop after two rounds and complete.
        maxToolRounds=2,
        onMaxToolRounds="complete",
    )
    out = await interop.run([step], {"question": "What is the weather where I live?"})

    assert out["run"]["status"] == "COMPLETED", out["run"]["error"]
    traces = out["traces"]
    assert [t["round"] for t in traces] == [1, 2]
    assert traces[0]["toolName"] == "get_city"
    assert traces[1]["toolName"] in {"get_city", "get_weather"}
    assert all(t["status"] == "completed" for t in traces)
    assert len(seen) == 2
    assert out["events"].count("TOOL_CALL_COMPLETED") == 2


async def test_tool_round_with_null_content_fails_once_instead_of_nine_times(interop: Interop) -> None:
    """The issue's failure, reproduced on purpose: `null` content is a 500 from this server.

    The body says the request is invalid, so neither the SDK nor the step retries it.
    """
    router = interop.harness.rt.providers
    provider = router.get("llamacpp")
    assert provider is not None
    provider.capabilities = ServerCapabilities(tool_call_content="null")  # type: ignore[attr-defined]
    seen: list[dict[str, Any]] = []
    register(interop, "get_weather", {"temp_c": 21}, seen)
    step = llm_step(
        tools=[WEATHER],
        toolChoice={"name": "get_weather"},
        retry={"maxAttempts": 3, "backoffMs": 100},
    )
    out = await interop.run([step], {"question": "What is the weather in Paris?"})

    assert out["run"]["status"] == "FAILED"
    assert (
        "HTTP 500" in out["run"]["error"]["message"] and "validation error" in out["run"]["error"]["message"]
    )
    assert [c["status"] for c in out["calls"]] == ["completed", "failed"]  # one attempt, not three
    assert len(seen) == 1


async def test_client_executed_tool_is_answered_through_the_api_and_the_run_completes(
    interop: Interop,
) -> None:
    location = {**CITY, "name": "get_location", "description": "The user's location", "execution": "client"}
    step = llm_step(tools=[location], toolChoice={"name": "get_location"})
    run_id = await interop.start([step], {"question": "Where am I?"})

    waiting = await interop.wait(run_id, "WAITING")
    [call] = waiting["requiredAction"]["toolCalls"]
    assert call["name"] == "get_location"
    answered = await interop.client.post(
        f"/v1/workflow-runs/{run_id}/tool-outputs",
        json={"toolOutputs": [{"toolCallId": call["id"], "output": {"city": "Paris"}}]},
        headers=interop.tenant.headers,
    )
    assert answered.status_code == 200, answered.text
    await interop.wait(run_id, "COMPLETED")
    out = await interop.collect(run_id)

    [trace] = out["traces"]
    assert trace["toolName"] == "get_location" and trace["status"] == "completed"
    assert trace["outputJson"] == {"city": "Paris"}
    assert out["events"].count("TOOL_CALL_COMPLETED") == 1
    # The output went back to the server in a second call, which it accepted.
    assert [c["status"] for c in out["calls"]] == ["completed", "completed"]


async def test_an_output_schema_falls_back_to_the_forced_final_answer_tool_and_its_answer_validates(
    interop: Interop,
) -> None:
    """llama-cpp-python 0.3.36 does not take OpenAI's `json_schema` response format (its own form is
    `{"type": "json_object", "schema": ...}`), so the server keeps `json_schema: false` and `native`
    falls back to the final-answer tool; a named tool choice makes the server constrain the call's
    arguments to the schema with a grammar."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    step = llm_step(outputSchema=schema, maxTokens=64)
    out = await interop.run([step], {"question": "Which city is the capital of France?"})

    assert out["run"]["status"] == "COMPLETED", out["run"]["error"]
    answer = out["run"]["state"]["ask"]
    assert isinstance(answer, dict) and isinstance(answer.get("city"), str)
    [call] = out["calls"]
    assert call["response"]["structuredOutput"] == "tool"
    assert call["response"]["structuredOutputFallback"] == "llamacpp has no native structured output"
    assert out["traces"] == []  # the final answer is not a tool that runs
