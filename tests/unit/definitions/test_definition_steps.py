from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from stevora.definitions import (
    STEP_TYPES,
    ApprovalStep,
    ConditionStep,
    ExternalEventStep,
    LlmStep,
    MapStep,
    TaskStep,
    ToolStep,
    WaitStep,
    parse_definition,
)
from stevora.errors import ValidationError


def problems_for_step(step: dict[str, Any]) -> dict[str, str]:
    """Parse a one-step definition that must fail; return its problems keyed by path."""
    with pytest.raises(ValidationError) as info:
        parse_definition({"name": "wf", "version": "1", "steps": [step]})
    return {problem["path"]: problem["message"] for problem in info.value.details["errors"]}


def test_step_types_lists_the_documented_types_and_matches_the_models() -> None:
    assert set(STEP_TYPES) == {
        "task",
        "wait",
        "condition",
        "external_event",
        "llm",
        "approval",
        "tool",
        "map",
    }
    models = (TaskStep, WaitStep, ConditionStep, ExternalEventStep, ApprovalStep, LlmStep, ToolStep, MapStep)
    assert {model.model_fields["type"].default for model in models} == set(STEP_TYPES)


def test_task_step_parses_handler_and_config() -> None:
    step = TaskStep.model_validate(
        {"type": "task", "name": "enrich", "handler": "enrich-lead", "config": {"a": 1}}
    )
    assert step.handler == "enrich-lead"
    assert step.config == {"a": 1}


def test_task_step_config_defaults_to_an_empty_dict() -> None:
    assert TaskStep(name="t", handler="h").config == {}


def test_task_step_requires_a_non_empty_handler() -> None:
    problems = problems_for_step({"type": "task", "name": "t", "handler": ""})
    assert "steps[0].handler" in problems


def test_step_name_of_101_characters_is_rejected() -> None:
    problems = problems_for_step({"type": "task", "name": "n" * 101, "handler": "h"})
    assert problems["steps[0].name"] == "String should have at most 100 characters"


def test_step_name_of_100_characters_is_accepted() -> None:
    definition = parse_definition(
        {"name": "wf", "version": "1", "steps": [{"type": "task", "name": "n" * 100, "handler": "h"}]}
    )
    assert definition.steps[0].name == "n" * 100


def test_empty_step_name_is_rejected() -> None:
    assert "steps[0].name" in problems_for_step({"type": "task", "name": "", "handler": "h"})


def test_wait_step_accepts_a_duration() -> None:
    step = WaitStep.model_validate({"name": "pause", "durationMs": 0})
    assert step.duration_ms == 0
    assert step.until_timestamp is None


def test_wait_step_accepts_an_aware_iso_timestamp() -> None:
    step = WaitStep.model_validate({"name": "pause", "untilTimestamp": "2030-01-01T09:00:00+02:00"})
    assert step.until_timestamp == datetime(2030, 1, 1, 7, 0, tzinfo=UTC)


def test_wait_step_with_neither_duration_nor_timestamp_names_the_step() -> None:
    problems = problems_for_step({"type": "wait", "name": "cool-off"})
    assert "cool-off" in problems["steps[0]"]
    assert "neither" in problems["steps[0]"]


def test_wait_step_with_both_duration_and_timestamp_is_rejected() -> None:
    problems = problems_for_step(
        {"type": "wait", "name": "cool-off", "durationMs": 10, "untilTimestamp": "2030-01-01T00:00:00Z"}
    )
    assert "cool-off" in problems["steps[0]"]
    assert "both" in problems["steps[0]"]


def test_wait_step_rejects_a_timestamp_without_timezone() -> None:
    problems = problems_for_step({"type": "wait", "name": "w", "untilTimestamp": "2030-01-01T00:00:00"})
    assert problems["steps[0].untilTimestamp"] == "Input should have timezone info"


def test_wait_step_rejects_a_negative_duration() -> None:
    assert "steps[0].durationMs" in problems_for_step({"type": "wait", "name": "w", "durationMs": -1})


def test_condition_step_parses_its_branch_targets() -> None:
    step = ConditionStep.model_validate(
        {"name": "check", "expression": "lead.size", "trueStep": "big", "falseStep": "small"}
    )
    assert (step.expression, step.true_step, step.false_step) == ("lead.size", "big", "small")


def test_external_event_step_rejects_zero_timeout_and_long_signal_type() -> None:
    problems = problems_for_step(
        {"type": "external_event", "name": "pay", "signalType": "s" * 101, "timeoutMs": 0}
    )
    assert set(problems) == {"steps[0].signalType", "steps[0].timeoutMs"}


def test_external_event_step_parses_signal_and_timeout() -> None:
    step = ExternalEventStep.model_validate(
        {"name": "pay", "signalType": "payment_confirmed", "timeoutMs": 86_400_000}
    )
    assert step.signal_type == "payment_confirmed"
    assert step.timeout_ms == 86_400_000


def test_approval_step_rejects_prompt_over_4000_characters() -> None:
    problems = problems_for_step({"type": "approval", "name": "a", "contentKey": "k", "prompt": "p" * 4001})
    assert "steps[0].prompt" in problems


def test_approval_step_requires_content_key() -> None:
    problems = problems_for_step({"type": "approval", "name": "a"})
    assert problems["steps[0].contentKey"] == "Field required"


def test_steps_are_immutable() -> None:
    step = TaskStep(name="t", handler="h")
    with pytest.raises(Exception, match="frozen"):
        step.handler = "other"  # type: ignore[misc, unused-ignore]


def test_step_fields_can_be_given_by_python_name_or_camel_case_alias() -> None:
    by_alias = ApprovalStep.model_validate({"name": "a", "contentKey": "k", "timeoutMs": 5})
    by_name = ApprovalStep.model_validate({"name": "a", "content_key": "k", "timeout_ms": 5})
    assert by_alias == by_name


def test_dumped_step_puts_type_first_and_uses_camel_case() -> None:
    dumped = ApprovalStep(name="a", content_key="k").model_dump(by_alias=True, exclude_none=True)
    assert list(dumped) == ["type", "name", "contentKey"]
