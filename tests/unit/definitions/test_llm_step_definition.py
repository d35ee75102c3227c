from __future__ import annotations

from typing import Any

import pytest

from stevora.definitions import LlmStep, LlmToolDef, NamedToolChoice, ToolRef, parse_definition
from stevora.errors import ValidationError

SEARCH_PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
    "required": ["query"],
}


def llm_step(**overrides: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "type": "llm",
        "name": "ask",
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "{{state.question}}"}],
    }
    step.update(overrides)
    return step


def inline_tool(name: str = "search", **overrides: Any) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": name, "description": "Search things", "parameters": SEARCH_PARAMETERS}
    tool.update(overrides)
    return tool


def problems_for_step(step: dict[str, Any]) -> dict[str, str]:
    """Parse a one-step definition that must fail; return its problems keyed by path."""
    with pytest.raises(ValidationError) as info:
        parse_definition({"name": "wf", "version": "1", "steps": [step]})
    return {problem["path"]: problem["message"] for problem in info.value.details["errors"]}


def test_llm_step_defaults_match_the_documented_tool_loop_limits() -> None:
    step = LlmStep.model_validate(llm_step())
    assert step.max_tool_rounds == 10
    assert step.on_max_tool_rounds == "fail"
    assert step.tool_timeout_ms == 30_000
    assert step.parallel_tool_calls is True
    assert step.tools == []
    assert step.fallback_models == []
    assert step.effective_retry().max_attempts == 3


@pytest.mark.parametrize("rounds", [0, 10_001])
def test_max_tool_rounds_outside_one_to_the_largest_ceiling_is_rejected(rounds: int) -> None:
    # Each server's own, lower ceiling (STEVORA_MAX_TOOL_ROUNDS) is checked when a definition is stored.
    assert "steps[0].maxToolRounds" in problems_for_step(llm_step(maxToolRounds=rounds))


@pytest.mark.parametrize("rounds", [1, 20, 500, 10_000])
def test_max_tool_rounds_at_the_limits_is_accepted(rounds: int) -> None:
    assert LlmStep.model_validate(llm_step(maxToolRounds=rounds)).max_tool_rounds == rounds


def test_temperature_above_two_is_rejected() -> None:
    problems = problems_for_step(llm_step(temperature=2.1))
    assert problems["steps[0].temperature"] == "Input should be less than or equal to 2"


def test_llm_step_needs_at_least_one_message() -> None:
    assert "steps[0].messages" in problems_for_step(llm_step(messages=[]))


def test_message_role_must_be_system_user_or_assistant() -> None:
    problems = problems_for_step(llm_step(messages=[{"role": "tool", "content": "x"}]))
    assert "steps[0].messages[0].role" in problems


def test_tool_timeout_is_bounded_to_one_hour() -> None:
    assert "steps[0].toolTimeoutMs" in problems_for_step(llm_step(toolTimeoutMs=3_600_001))


def test_guardrails_default_to_warn_with_two_feedback_attempts() -> None:
    step = LlmStep.model_validate(llm_step(guardrails={"postChecks": [{"type": "schema_validation"}]}))
    assert step.guardrails is not None
    assert step.guardrails.on_failure == "warn"
    assert step.guardrails.max_feedback_attempts == 2
    assert step.guardrails.post_checks[0].config == {}


def test_unknown_guardrail_check_type_is_rejected() -> None:
    problems = problems_for_step(llm_step(guardrails={"postChecks": [{"type": "vibes"}]}))
    assert "steps[0].guardrails.postChecks[0].type" in problems


def test_output_key_defaults_to_the_step_name() -> None:
    assert LlmStep.model_validate(llm_step()).effective_output_key() == "ask"
    assert LlmStep.model_validate(llm_step(outputKey="answer")).effective_output_key() == "answer"


def test_inline_tool_definition_is_parsed() -> None:
    step = LlmStep.model_validate(llm_step(tools=[inline_tool()]))
    assert step.tools == [
        LlmToolDef(name="search", description="Search things", parameters=SEARCH_PARAMETERS)
    ]


def test_bare_string_and_name_only_tools_normalise_to_tool_refs() -> None:
    step = LlmStep.model_validate(llm_step(tools=["lookup_order", {"name": "refund"}]))
    assert step.tools == [ToolRef("lookup_order"), ToolRef(name="refund")]


def test_tool_refs_dump_as_name_objects_that_parse_back() -> None:
    step = LlmStep.model_validate(llm_step(tools=["lookup_order"]))
    dumped = step.model_dump(by_alias=True, exclude_none=True)
    assert dumped["tools"] == [{"name": "lookup_order"}]
    assert LlmStep.model_validate(dumped) == step


def test_inline_tool_missing_parameters_reports_the_missing_field() -> None:
    problems = problems_for_step(llm_step(tools=[{"name": "search", "description": "d"}]))
    assert problems == {"steps[0].tools[0].parameters": "Field required"}


@pytest.mark.parametrize("name", ["has space", "dot.name", "", "é"])
def test_tool_name_with_characters_providers_reject_is_an_error(name: str) -> None:
    problems = problems_for_step(llm_step(tools=[inline_tool(name)]))
    assert "1-64 characters" in problems["steps[0].tools[0].name"]


def test_tool_name_of_65_characters_is_rejected_and_64_accepted() -> None:
    assert "steps[0].tools[0].name" in problems_for_step(llm_step(tools=[inline_tool("a" * 65)]))
    assert LlmStep.model_validate(llm_step(tools=[inline_tool("a" * 64)])).tools[0].name == "a" * 64


def test_tool_ref_names_follow_the_same_rule() -> None:
    assert "steps[0].tools[0].name" in problems_for_step(llm_step(tools=["bad name"]))


def test_tool_description_over_1024_characters_is_rejected() -> None:
    problems = problems_for_step(llm_step(tools=[inline_tool(description="d" * 1025)]))
    assert "steps[0].tools[0].description" in problems


@pytest.mark.parametrize("parameters", [{}, {"type": "string"}, {"properties": {"q": {"type": "string"}}}])
def test_tool_parameters_must_be_an_object_schema(parameters: dict[str, Any]) -> None:
    problems = problems_for_step(llm_step(tools=[inline_tool(parameters=parameters)]))
    assert '"type": "object"' in problems["steps[0].tools[0].parameters"]


def test_tool_parameters_that_are_not_a_valid_json_schema_are_rejected() -> None:
    parameters = {"type": "object", "properties": {"q": {"type": "strin"}}}
    problems = problems_for_step(llm_step(tools=[inline_tool(parameters=parameters)]))
    message = problems["steps[0].tools[0].parameters"]
    assert "not a valid JSON Schema" in message
    assert "$.properties.q.type" in message


def test_tool_parameters_with_unknown_dollar_schema_are_checked_against_the_latest_draft() -> None:
    parameters = {"$schema": "https://example.com/custom", "type": "object", "required": "q"}
    problems = problems_for_step(llm_step(tools=[inline_tool(parameters=parameters)]))
    assert "not a valid JSON Schema" in problems["steps[0].tools[0].parameters"]


def test_more_than_128_tools_is_rejected() -> None:
    tools = [f"tool_{i}" for i in range(129)]
    problems = problems_for_step(llm_step(tools=tools))
    assert problems["steps[0].tools"] == "List should have at most 128 items after validation, not 129"


def test_exactly_128_tools_is_accepted() -> None:
    assert len(LlmStep.model_validate(llm_step(tools=[f"tool_{i}" for i in range(128)])).tools) == 128


def test_duplicate_tool_names_within_a_step_are_rejected() -> None:
    problems = problems_for_step(llm_step(tools=[inline_tool("search"), "other", "search"]))
    assert problems == {"steps[0].tools[2].name": "Duplicate tool name 'search' (already used by tools[0])"}


def test_duplicate_tool_names_are_reported_alongside_other_tool_errors() -> None:
    problems = problems_for_step(llm_step(tools=["search", inline_tool("search", parameters={})]))
    assert set(problems) == {"steps[0].tools[1].name", "steps[0].tools[1].parameters"}


def test_tool_choice_defaults_to_auto() -> None:
    assert LlmStep.model_validate(llm_step()).tool_choice == "auto"


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
def test_tool_choice_modes_are_accepted(choice: str) -> None:
    step = LlmStep.model_validate(llm_step(tools=[inline_tool()], toolChoice=choice))
    assert step.tool_choice == choice


def test_tool_choice_naming_a_step_tool_is_accepted_and_round_trips() -> None:
    step = LlmStep.model_validate(llm_step(tools=[inline_tool(), "lookup"], toolChoice={"name": "lookup"}))
    assert isinstance(step.tool_choice, NamedToolChoice) and step.tool_choice.name == "lookup"
    assert step.model_dump(by_alias=True)["toolChoice"] == {"name": "lookup"}


def test_tool_choice_naming_no_tool_of_the_step_is_rejected_with_its_path() -> None:
    problems = problems_for_step(llm_step(tools=[inline_tool()], toolChoice={"name": "lookup"}))
    assert problems == {
        "steps[0].toolChoice": "toolChoice names 'lookup', which is not one of this step's tools (search)"
    }


@pytest.mark.parametrize("choice", ["any", 3, {"name": "search", "type": "function"}, {"tool": "search"}])
def test_malformed_tool_choice_gets_one_error_naming_the_field(choice: Any) -> None:
    problems = problems_for_step(llm_step(tools=[inline_tool()], toolChoice=choice))
    assert list(problems) == ["steps[0].toolChoice"]
    assert problems["steps[0].toolChoice"].startswith(
        'toolChoice must be "auto", "required", "none" or {"name"'
    )


def test_required_tool_choice_without_tools_is_rejected() -> None:
    problems = problems_for_step(llm_step(toolChoice="required"))
    assert problems == {"steps[0].toolChoice": "toolChoice 'required' needs at least one tool in 'tools'"}


def test_structured_output_native_refuses_an_open_object_naming_its_field() -> None:
    schema = {
        "type": "object",
        "properties": {"x": {"type": "object", "additionalProperties": True}},
        "required": ["x"],
    }
    problems = problems_for_step(llm_step(structuredOutput="native", outputSchema=schema))
    assert list(problems) == ["steps[0].outputSchema.properties.x.additionalProperties"]


def test_structured_output_defaults_to_unset_and_accepts_any_schema_then() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    step = LlmStep.model_validate(llm_step(outputSchema=schema))
    assert step.structured_output is None  # native, falling back to the tool at run time


def test_structured_output_outside_its_three_modes_is_rejected() -> None:
    assert "steps[0].structuredOutput" in problems_for_step(llm_step(structuredOutput="grammar"))
