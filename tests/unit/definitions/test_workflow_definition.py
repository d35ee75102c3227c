from __future__ import annotations

import copy
from typing import Any

import pytest

from stevora.definitions import (
    ConditionStep,
    LlmStep,
    LlmToolDef,
    TaskStep,
    WorkflowDefinitionSpec,
    parse_definition,
)
from stevora.errors import ValidationError

RESEARCH_AGENT: dict[str, Any] = {
    "name": "customer-research",
    "version": "1.0.0",
    "steps": [
        {
            "type": "llm",
            "name": "research-agent",
            "model": "gpt-4o",
            "systemPrompt": "You are a research assistant. Use the tools to answer.",
            "messages": [{"role": "user", "content": "{{state.question}}"}],
            "tools": [
                {
                    "name": "search_knowledge_base",
                    "description": "Search the internal knowledge base",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "query": {"type": "string", "description": "Search query"},
                            "limit": {"type": "number", "description": "Max results"},
                        },
                        "required": ["query"],
                    },
                },
                {
                    "name": "get_customer_data",
                    "description": "Look up a customer by id",
                    "parameters": {
                        "type": "object",
                        "properties": {"customerId": {"type": "string"}},
                        "required": ["customerId"],
                    },
                },
            ],
            "maxToolRounds": 5,
        }
    ],
}

BRANCHING: dict[str, Any] = {
    "name": "lead-routing",
    "version": "2",
    "description": "Route leads by company size",
    "steps": [
        {"type": "task", "name": "enrich", "handler": "enrich-lead", "config": {"source": "crm"}},
        {
            "type": "condition",
            "name": "is-big",
            "expression": "lead.size",
            "trueStep": "sales",
            "falseStep": "nurture",
        },
        {"type": "wait", "name": "sales", "untilTimestamp": "2030-01-01T00:00:00Z"},
        {"type": "external_event", "name": "nurture", "signalType": "replied", "timeoutMs": 1000},
        {"type": "approval", "name": "review", "contentKey": "draft", "prompt": "Check it"},
        {
            "type": "llm",
            "name": "write",
            "model": "claude-sonnet-4-20250514",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": ["lookup"],
        },
    ],
}


def definition_with(steps: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"name": "wf", "version": "1", "steps": steps, **fields}


def task(name: str) -> dict[str, Any]:
    return {"type": "task", "name": name, "handler": "h"}


def problems_of(data: Any) -> list[dict[str, str]]:
    with pytest.raises(ValidationError) as info:
        parse_definition(data)
    assert info.value.code == "VALIDATION_ERROR"
    assert info.value.http_status == 400
    problems: list[dict[str, str]] = info.value.details["errors"]
    return problems


def paths_of(data: Any) -> dict[str, str]:
    return {problem["path"]: problem["message"] for problem in problems_of(data)}


def test_reference_research_agent_example_parses() -> None:
    definition = parse_definition(RESEARCH_AGENT)
    step = definition.step("research-agent")
    assert isinstance(step, LlmStep)
    assert step.model == "gpt-4o"
    assert step.max_tool_rounds == 5
    assert [tool.name for tool in step.tools] == ["search_knowledge_base", "get_customer_data"]
    assert all(isinstance(tool, LlmToolDef) for tool in step.tools)


def test_every_step_type_parses_into_its_model() -> None:
    definition = parse_definition(BRANCHING)
    assert [step.type for step in definition.steps] == [
        "task",
        "condition",
        "wait",
        "external_event",
        "approval",
        "llm",
    ]
    assert isinstance(definition.steps[1], ConditionStep)


@pytest.mark.parametrize("source", [RESEARCH_AGENT, BRANCHING], ids=["research-agent", "branching"])
def test_camel_case_dump_round_trip_is_idempotent(source: dict[str, Any]) -> None:
    first = parse_definition(source)
    dumped = first.model_dump(by_alias=True, exclude_none=True)
    second = parse_definition(dumped)
    assert second == first
    assert second.model_dump(by_alias=True, exclude_none=True) == dumped
    step_keys = {key for step in dumped["steps"] for key in step}
    assert step_keys and not any("_" in key for key in step_keys)


def test_json_mode_dump_round_trips_through_wire_json() -> None:
    first = parse_definition(BRANCHING)
    wire = first.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert wire["steps"][2]["untilTimestamp"] == "2030-01-01T00:00:00Z"
    assert parse_definition(wire) == first


def test_parse_does_not_modify_its_input() -> None:
    source = copy.deepcopy(BRANCHING)
    parse_definition(source)
    assert source == BRANCHING


def test_step_and_index_of_find_steps_by_name() -> None:
    definition = parse_definition(BRANCHING)
    assert definition.index_of("nurture") == 3
    assert definition.step("enrich") == TaskStep(
        name="enrich", handler="enrich-lead", config={"source": "crm"}
    )
    with pytest.raises(KeyError):
        definition.step("missing")


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"name": "n" * 201}, "name"),
        ({"name": ""}, "name"),
        ({"version": "v" * 51}, "version"),
        ({"version": ""}, "version"),
        ({"description": "d" * 1001}, "description"),
    ],
)
def test_definition_fields_outside_documented_limits_are_rejected(fields: dict[str, Any], path: str) -> None:
    assert path in paths_of(definition_with([task("a")], **fields))


def test_definition_fields_at_documented_limits_are_accepted() -> None:
    definition = parse_definition(
        definition_with([task("a")], name="n" * 200, version="v" * 50, description="d" * 1000)
    )
    assert len(definition.name) == 200


def test_definition_without_steps_is_rejected() -> None:
    assert paths_of(definition_with([])) == {
        "steps": "List should have at least 1 item after validation, not 0"
    }


def test_duplicate_step_names_are_rejected_with_the_duplicate_named() -> None:
    problems = paths_of(definition_with([task("a"), task("b"), task("a")]))
    assert problems == {"steps[2].name": "Duplicate step name 'a' (already used by steps[0])"}


def test_duplicate_step_names_raise_when_validating_the_model_directly() -> None:
    with pytest.raises(Exception, match="Duplicate step name 'a'"):
        WorkflowDefinitionSpec.model_validate(definition_with([task("a"), task("a")]))


def test_condition_targets_must_name_existing_steps() -> None:
    condition = {"type": "condition", "name": "c", "expression": "x", "trueStep": "a", "falseStep": "nowhere"}
    problems = paths_of(definition_with([condition, task("a")]))
    assert problems == {"steps[0].falseStep": "falseStep 'nowhere' does not name a step in this workflow"}


def test_goto_targets_must_name_existing_steps_and_are_reported_beside_field_errors() -> None:
    step = {"type": "llm", "name": "ask", "model": "gpt-4o", "messages": [{"role": "user", "content": "q"}]}
    assert paths_of(definition_with([{**step, "gotoTargets": ["a", "nowhere"]}, task("a")])) == {
        "steps[0].gotoTargets[1]": "gotoTargets 'nowhere' does not name a step in this workflow"
    }
    # With another field invalid, pydantic skips the model's rules; the raw check still reports it.
    problems = paths_of(
        definition_with([{**step, "gotoTargets": ["nowhere"], "maxToolRounds": 0}, task("a")])
    )
    assert set(problems) == {"steps[0].maxToolRounds", "steps[0].gotoTargets[0]"}
    parsed = parse_definition(definition_with([{**step, "gotoTargets": ["a", "ask"]}, task("a")]))
    assert isinstance(parsed.steps[0], LlmStep) and parsed.steps[0].goto_targets == ["a", "ask"]


def test_condition_branching_to_itself_is_rejected() -> None:
    condition = {"type": "condition", "name": "c", "expression": "x", "trueStep": "c", "falseStep": "a"}
    problems = paths_of(definition_with([condition, task("a")]))
    assert list(problems) == ["steps[0].trueStep"]


def test_condition_may_branch_back_to_an_earlier_step() -> None:
    condition = {"type": "condition", "name": "c", "expression": "again", "trueStep": "a", "falseStep": "b"}
    definition = parse_definition(definition_with([task("a"), condition, task("b")]))
    assert definition.index_of("c") == 1


def test_unknown_step_type_points_at_type_and_lists_the_allowed_types() -> None:
    problems = paths_of(definition_with([task("a"), {"type": "sleep", "name": "s"}]))
    message = problems["steps[1].type"]
    assert "'sleep'" in message
    for allowed in ("task", "wait", "condition", "external_event", "llm", "approval"):
        assert allowed in message


def test_missing_step_type_points_at_type() -> None:
    assert "steps[0].type" in paths_of(definition_with([{"name": "x"}]))


def test_misspelled_field_is_named_in_path_and_message() -> None:
    step = {"type": "llm", "name": "ask", "model": "gpt-4o", "messages": [{"role": "user", "content": "q"}]}
    problems = paths_of(definition_with([{**step, "maxToolRound": 5}]))
    assert problems == {
        "steps[0].maxToolRound": "Unknown field 'maxToolRound' (did you mean 'maxToolRounds'?)"
    }


def test_unknown_top_level_field_is_rejected() -> None:
    assert "author" in paths_of(definition_with([task("a")], author="me"))


def test_definition_that_is_not_an_object_is_rejected_with_an_empty_path() -> None:
    problems = problems_of(["not", "a", "definition"])
    assert problems[0]["path"] == ""


def test_definition_with_several_problems_reports_every_one_with_its_path() -> None:
    data = definition_with(
        [
            task("dup"),
            {"type": "wait", "name": "w"},
            {
                "type": "llm",
                "name": "dup",
                "model": "gpt-4o",
                "messages": [{"role": "user", "content": "q"}],
                "maxToolRounds": 10_001,
                "temperature": 3,
                "tools": [{"name": "bad name", "description": "d", "parameters": {"type": "object"}}],
            },
            {"type": "condition", "name": "c", "expression": "x", "trueStep": "dup", "falseStep": "gone"},
            {"type": "teleport", "name": "t"},
        ],
        version="v" * 51,
    )
    problems = problems_of(data)
    assert [problem["path"] for problem in problems] == [
        "version",
        "steps[1]",
        "steps[2].temperature",
        "steps[2].tools[0].name",
        "steps[2].maxToolRounds",
        "steps[2].name",
        "steps[3].falseStep",
        "steps[4].type",
    ]
    assert all(problem["message"] for problem in problems)


def test_error_message_summarises_all_problems() -> None:
    with pytest.raises(ValidationError) as info:
        parse_definition(definition_with([task("a"), task("a")], name=""))
    assert "name: String should have at least 1 character" in info.value.message
    assert "steps[1].name: Duplicate step name 'a'" in info.value.message


def test_definition_models_are_frozen() -> None:
    definition = parse_definition(BRANCHING)
    with pytest.raises(Exception, match="frozen"):
        definition.name = "changed"  # type: ignore[misc, unused-ignore]
