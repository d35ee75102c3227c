"""The fork form's edits (stevora/ui/time_travel.py): the state editor's two forms, only changed
results become edits, and every mistake names the API's field."""

from __future__ import annotations

from typing import Any

import pytest

from stevora.errors import ValidationError
from stevora.ui.time_travel import PreviousCall, at_value, parse_edits, parse_state


def _path(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    problems: list[dict[str, Any]] = exc.value.details["errors"]
    return str(problems[0]["path"])


def _call(call_id: str, output: Any, status: str = "completed") -> PreviousCall:
    return PreviousCall(
        call_id, "lookup", {"n": 1}, status, output, None if status == "completed" else "boom", None
    )


def test_state_is_key_json_lines_or_a_json_object() -> None:
    assert parse_state('tier="gold"\n\n limit = 5 \nflags={"a": [1]}') == {
        "tier": "gold",
        "limit": 5,
        "flags": {"a": [1]},
    }
    assert parse_state('{"tier": "gold", "n": null}') == {"tier": "gold", "n": None}
    assert parse_state("  \n ") == {}


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("tier=gold", "edits.state.tier"),  # text must be quoted JSON
        ("just words", "edits.state"),
        ("=5", "edits.state"),
        ('{"tier": ', "edits.state"),
        ("[1, 2]", "edits.state"),
    ],
)
def test_a_state_mistake_names_the_field(text: str, path: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_state(text)
    assert _path(exc) == path


def test_only_changed_results_become_edits() -> None:
    previous = [_call("call_1", {"balance": 10}), _call("call_2", "x"), _call("call_3", None, "failed")]
    form = {
        "result.call_1": '{\n  "balance": 10\n}',  # as shown: unchanged
        "result.call_2": ' "x" ',  # the same value, other spacing
        "result.call_3": "",  # a failed call left empty keeps its error
    }
    assert parse_edits(form, previous) == {}
    form = {
        "result.call_1": '{"balance": 0}',
        "result.call_3": '"recovered"',
        "model": " gpt-4.1-mini ",
        "systemPrompt": "Be terse.",
        "definitionVersion": "2",
    }
    assert parse_edits(form, previous) == {
        "toolResults": {"call_1": {"balance": 0}, "call_3": "recovered"},
        "model": "gpt-4.1-mini",
        "systemPrompt": "Be terse.",
        "definitionVersion": "2",
    }
    assert parse_edits({"model": " ", "systemPrompt": "\n", "definitionVersion": ""}, previous) == {}


def test_a_result_that_is_not_json_names_its_call() -> None:
    with pytest.raises(ValidationError) as exc:
        parse_edits({"result.call_1": "balance is zero"}, [_call("call_1", 1)])
    assert _path(exc) == "edits.toolResults.call_1"


def test_a_result_for_a_call_of_another_round_is_passed_on_for_the_engine_to_refuse() -> None:
    assert parse_edits({"result.call_9": "1"}, [_call("call_1", 1)]) == {"toolResults": {"call_9": 1}}


def test_the_point_keeps_its_visit() -> None:
    assert at_value("agent:3", None) == "agent:3"
    assert at_value("agent:3", "1") == "agent:3"
    assert at_value("agent:3", "2") == {"step": "agent", "round": 3, "visit": 2}
    assert at_value("agent", "2") == {"step": "agent", "round": None, "visit": 2}
    with pytest.raises(ValidationError) as exc:
        at_value("agent:x", None)
    assert _path(exc) == "at"
