"""ScriptedProvider: deterministic offline agent, explicit scripts, latency."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from stevora.errors import ProviderError
from stevora.llm.messages import LlmRequest, LlmResponse, Message, ToolSpec, Usage
from stevora.llm.scripted_provider import ScriptedProvider, synthesize_value

SEARCH = ToolSpec(
    "search",
    "Search",
    {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "score": {"type": "number"},
            "exact": {"type": "boolean"},
            "mode": {"type": "string", "enum": ["fast", "deep"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "filters": {"type": "object"},
        },
        "required": ["query"],
    },
)
CUSTOMER = ToolSpec(
    "get_customer", "Customer", {"type": "object", "properties": {"customerId": {"type": "string"}}}
)


async def test_first_turn_calls_every_tool_once_with_synthesised_arguments():
    provider = ScriptedProvider()
    question = "Find the refund policy for enterprise customers in Europe, including every exception"
    response = await provider.complete(
        LlmRequest(
            model="scripted",
            messages=[Message.system("sys"), Message.user(question)],
            tools=[SEARCH, CUSTOMER],
        )
    )
    assert response.text is None
    assert response.finish_reason == "tool_calls"
    assert [(c.id, c.name) for c in response.tool_calls] == [("call_1", "search"), ("call_2", "get_customer")]
    assert json.loads(response.tool_calls[0].arguments) == {
        "query": question[:60],
        "limit": 3,
        "score": 3.0,
        "exact": True,
        "mode": "fast",
        "tags": [],
        "filters": {},
    }
    # No id in the prompt: an id-looking value, never the question itself.
    assert json.loads(response.tool_calls[1].arguments) == {"customerId": "customer_1"}
    assert response.usage == Usage(input_tokens=(3 + len(question)) // 4, output_tokens=10)
    assert response.provider == "scripted" and response.model == "scripted"


async def test_after_tool_results_it_answers_quoting_them():
    provider = ScriptedProvider()
    request = LlmRequest(model="scripted", messages=[Message.user("Weather?")], tools=[CUSTOMER])
    first = await provider.complete(request)
    long_result = "x" * 500
    request.messages += [first.to_message(), Message.tool_result("call_1", long_result)]
    final = await provider.complete(request)

    assert final.tool_calls == []
    assert final.finish_reason == "stop"
    assert final.text == f"Scripted answer to: Weather?. Tool results: get_customer: {'x' * 200}"
    assert final.usage.output_tokens == len(final.text) // 4


async def test_without_tools_it_answers_immediately_and_says_example_without_user_text():
    response = await ScriptedProvider().complete(
        LlmRequest(model="scripted", messages=[Message.system("only")])
    )
    assert response.text == "Scripted answer to: ."
    assert json.loads(json.dumps(synthesize_value({"type": "string"}))) == "example"


async def test_json_answer_has_every_output_schema_key():
    schema = {"riskScore": {"type": "number"}, "label": {"enum": ["low", "high"]}, "notes": "free text"}
    response = await ScriptedProvider().complete(
        LlmRequest(model="scripted", messages=[Message.user("Assess")], output_schema=schema)
    )
    assert json.loads(response.text or "") == {"riskScore": 3.0, "label": "low", "notes": "example"}


async def test_json_answer_for_a_full_object_schema_uses_its_properties():
    schema = {"type": "object", "properties": {"subject": {"type": "string"}, "count": {"type": "integer"}}}
    response = await ScriptedProvider().complete(
        LlmRequest(
            model="scripted", messages=[Message.user("Write")], response_format="json", output_schema=schema
        )
    )
    assert json.loads(response.text or "") == {"subject": "Write", "count": 3}


async def test_explicit_script_is_replayed_in_order_then_exhausted():
    script = [
        LlmResponse("one", [], Usage(1, 1), "m", "stop", "r1", "scripted"),
        LlmResponse("two", [], Usage(2, 2), "m", "stop", "r2", "scripted"),
    ]
    provider = ScriptedProvider(script)
    request = LlmRequest(model="scripted", messages=[Message.user("hi")])
    assert [(await provider.complete(request)).text for _ in range(2)] == ["one", "two"]
    with pytest.raises(ProviderError, match="exhausted") as caught:
        await provider.complete(request)
    assert caught.value.retryable is False
    assert len(provider.requests) == 3


async def test_script_can_raise_errors_and_enqueued_answers_precede_the_rules():
    provider = ScriptedProvider()
    overloaded = ProviderError("overloaded", provider="scripted", status_code=529, retryable=True)
    provider.enqueue(overloaded, LlmResponse("queued", [], Usage(), "m", "stop", None, "scripted"))
    request = LlmRequest(model="scripted", messages=[Message.user("hi")])
    with pytest.raises(ProviderError) as caught:
        await provider.complete(request)
    assert caught.value is overloaded
    assert (await provider.complete(request)).text == "queued"
    assert (await provider.complete(request)).text == "Scripted answer to: hi."


async def test_latency_is_simulated_without_blocking_other_calls():
    provider = ScriptedProvider(latency_s=0.1)
    request = LlmRequest(model="scripted", messages=[Message.user("hi")])
    started = time.monotonic()
    await asyncio.gather(*(provider.complete(request) for _ in range(20)))
    # Blocking calls would take 20 x 0.1 s = 2 s; the margin is for a loaded machine.
    assert 0.1 <= time.monotonic() - started < 1.5


def test_schema_synthesis_handles_unions_nullable_and_const():
    assert synthesize_value({"anyOf": [{"type": "integer"}, {"type": "string"}]}) == 3
    assert synthesize_value({"type": ["null", "boolean"]}) is True
    assert synthesize_value({"const": "fixed"}) == "fixed"
    assert synthesize_value({"properties": {"a": {"type": "integer"}}}) == {"a": 3}


def test_id_properties_get_an_id_token_from_the_prompt_not_the_whole_prompt() -> None:
    from stevora.llm.scripted_provider import synthesize_value

    schema = {"type": "object", "properties": {"customerId": {"type": "string"}, "query": {"type": "string"}}}
    value = synthesize_value(schema, "Refund policy? (customer cus_42)")
    assert value == {"customerId": "cus_42", "query": "Refund policy? (customer cus_42)"}


async def test_the_answer_quotes_json_results_as_prose_not_as_a_json_text() -> None:
    """The answer lands in the run's state and output: a JSON text inside it would be a wall of
    escaped quotes on the run page."""
    provider = ScriptedProvider()
    request = LlmRequest(model="scripted", messages=[Message.user("Refunds?")], tools=[SEARCH, CUSTOMER])
    first = await provider.complete(request)
    articles = json.dumps([{"id": "kb_1", "title": "Refund policy", "body": "x" * 300}, {"title": "SSO"}])
    customer = json.dumps({"plan": "enterprise", "seats": 250, "address": {"city": "Oslo"}})
    request.messages += [
        first.to_message(),
        Message.tool_result("call_1", articles),
        Message.tool_result("call_2", customer),
    ]
    final = await provider.complete(request)
    assert final.text == (
        "Scripted answer to: Refunds?. Tool results: search: 2 result(s) (Refund policy, SSO); "
        "get_customer: plan enterprise, seats 250"
    )
