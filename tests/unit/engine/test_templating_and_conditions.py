from __future__ import annotations

import math

import pytest

from stevora.engine.steps.condition import evaluate, js_truthy
from stevora.tasks import StepResult
from stevora.templating import render_template

INPUT = {"name": "Ada", "n": 3, "user": {"tags": ["a", "b"]}}
STATE = {"question": "Why?", "nested": {"deep": {"x": 1}}, "items": [{"title": "first"}], "name": "State Ada"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hi {{input.name}}", "Hi Ada"),
        ("{{state.question}}", "Why?"),
        ("{{ state.nested.deep.x }}", "1"),
        ("{{state.nested.deep}}", '{"x":1}'),
        ("{{state.items.0.title}}", "first"),
        ("{{input.user.tags}}", '["a","b"]'),
        ("{{name}}", "State Ada"),  # bare names look in state first
        ("{{n}}", "3"),  # ...then input
        ("[{{state.missing.key}}]", "[]"),  # a missing key renders empty
        ("no placeholders", "no placeholders"),
    ],
)
def test_templates_render_input_state_dot_paths_and_json(text: str, expected: str) -> None:
    assert render_template(text, input=INPUT, state=STATE) == expected


@pytest.mark.parametrize(
    ("value", "truthy"),
    [
        (0, False),
        (0.0, False),
        (math.nan, False),
        ("", False),
        (None, False),
        (False, False),
        (True, True),
        (1, True),
        (-2.5, True),
        ("0", True),
        ("false", True),
        ({}, True),
        ([], True),
        ({"a": 1}, True),
    ],
)
def test_truthiness_matches_javascript_boolean(value: object, truthy: bool) -> None:
    assert js_truthy(value) is truthy


def test_condition_walks_state_and_treats_missing_intermediate_keys_as_false() -> None:
    state = {"enrichedLead": {"company": {"size": 120}}, "reviewResult": {"approved": False}}
    assert evaluate("enrichedLead.company.size", state) is True
    assert evaluate("reviewResult.approved", state) is False
    assert evaluate("enrichedLead.nope.size", state) is False
    assert evaluate("state.enrichedLead.company.size", state) is True


def test_step_results_are_coerced_from_the_documented_dict_shape() -> None:
    r = StepResult.coerce({"status": "completed", "output": {"a": 1}, "stateUpdates": {"b": 2}})
    assert (r.status, r.output, r.state_updates) == ("completed", {"a": 1}, {"b": 2})
    failed = StepResult.coerce({"status": "failed", "error": {"message": "x", "code": "E"}})
    assert failed.status == "failed" and failed.error == {"message": "x", "code": "E"}
    assert StepResult.coerce({"plain": True}).output == {"plain": True}
    assert StepResult.coerce(None).status == "completed"
