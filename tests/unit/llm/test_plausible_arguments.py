"""The offline model's tool arguments look like a model's for the examples' tools: a city from the
prompt, the order's amount, a currency the conversation names, the shopping item, numbers within
bounds, formats; the same conversation always gives the same arguments."""

from __future__ import annotations

import json

import examples.refund_desk
import examples.toolbox
import examples.tools
from stevora.llm.messages import LlmRequest, Message, ToolSpec
from stevora.llm.plausible_arguments import Seed, synthesize_value
from stevora.llm.scripted_provider import scripted_response
from stevora.tools import ToolRegistry, register_toolbox
from stevora.tools.registry import default_registry

WEATHER = ToolSpec(
    "get_weather",
    "Weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def _example(name: str) -> ToolSpec:
    registered = default_registry.get(name)
    assert registered is not None, f"{name} is registered by the examples"
    return ToolSpec(registered.name, registered.description, dict(registered.parameters))


def _calls(prompt: str, *tools: ToolSpec, after: list[Message] | None = None) -> dict[str, object]:
    messages = [Message.user(prompt), *(after or [])]
    response = scripted_response(LlmRequest(model="gpt-4o", messages=messages, tools=list(tools)))
    return {call.name: json.loads(call.arguments) for call in response.tool_calls}


def test_a_city_is_a_place_from_the_prompt_not_the_question() -> None:
    assert _calls("Weather in Rome?", WEATHER) == {"get_weather": {"city": "Rome"}}
    assert _calls("Is it cold in New York today?", WEATHER) == {"get_weather": {"city": "New York"}}
    # examples/client-tools.json names no place: a city all the same, never the question.
    asked = "What should I wear today? Use my location and the local weather."
    assert _calls(asked, WEATHER) == {"get_weather": {"city": "Lisbon"}}


def test_the_refund_desk_refunds_the_orders_amount() -> None:
    order = json.dumps(examples.refund_desk.ORDERS["ord_1042"])
    prompt = f"Order: {order}. The customer asks for a refund because: it arrived broken"
    assert _calls(prompt, _example("issue_refund")) == {
        "issue_refund": {"orderId": "ord_1042", "amount": 120}
    }


def test_the_research_agent_searches_the_question_for_its_customer() -> None:
    question = "How do refunds work for enterprise plans? (customer cus_42)"
    calls = _calls(question, _example("search_knowledge_base"), _example("get_customer_data"))
    assert calls == {
        "search_knowledge_base": {"query": question[:60], "limit": 3},  # the tool's default
        "get_customer_data": {"customerId": "cus_42"},
    }


def test_a_currency_is_the_enum_value_the_prompt_names_and_the_amount_its_number() -> None:
    calls = _calls("Convert 120 EUR to dollars", _example("convert_currency"))
    assert calls == {"convert_currency": {"amount": 120.0, "currency": "EUR"}}


def test_the_shopping_agent_adds_the_item_and_does_not_empty_the_list_unasked() -> None:
    registry = ToolRegistry()
    names = register_toolbox(examples.toolbox.ShoppingList, registry=registry)
    tools = [ToolSpec(n, "", dict(registry.get(n).parameters)) for n in names]  # type: ignore[union-attr]
    assert _calls("Add oat milk and eggs, then read the list back", *tools) == {
        "ShoppingList_add": {"item": "oat milk", "quantity": 1},
        "ShoppingList_show": {},
    }
    asked = _calls("Remove the oat milk", *tools)
    assert sorted(asked) == names  # asked to remove: every tool, as before


def test_a_later_round_takes_a_value_from_a_tool_result() -> None:
    location = ToolSpec("get_location", "Where", {"type": "object", "properties": {}})
    first = scripted_response(
        LlmRequest(
            model="scripted:rounds=2", messages=[Message.user("What to wear?")], tools=[location, WEATHER]
        )
    )
    results = [first.to_message(), *(Message.tool_result(c.id, '{"city": "Oslo"}') for c in first.tool_calls)]
    second = scripted_response(
        LlmRequest(
            model="scripted:rounds=2", messages=[Message.user("What to wear?"), *results], tools=[WEATHER]
        )
    )
    assert json.loads(second.tool_calls[0].arguments) == {"city": "Oslo"}


def test_numbers_stay_within_bounds_and_formats_are_honoured() -> None:
    schema = {
        "type": "object",
        "properties": {
            "limit": {"type": "integer", "minimum": 10, "maximum": 20},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
            "amount": {"type": "number", "maximum": 100},
            "day": {"type": "string", "format": "date"},
            "email": {"type": "string"},
            "code": {"type": "string", "maxLength": 4},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "mode": {"enum": ["fast", "deep"]},
        },
    }
    prompt = "A deep search for 250 dollars, mail ana@example.org"
    value = synthesize_value(schema, Seed(prompt, prompt))
    assert value["limit"] == 15 and 0 < value["ratio"] <= 0.5
    assert value["amount"] == 25.0  # 250 is beyond the maximum: not taken from the prompt
    assert value["day"] == "2026-01-15" and value["email"] == "ana@example.org"
    assert value["code"] == prompt[:4] and len(value["tags"]) == 1 and value["mode"] == "deep"
    assert synthesize_value(schema, Seed(prompt, prompt)) == value  # deterministic
