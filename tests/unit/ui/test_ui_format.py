"""The UI's formatting rules and its auth helpers, without a browser or a database."""

from __future__ import annotations

from datetime import timedelta

from stevora.clock import utcnow
from stevora.ui.auth import csrf_token_for, safe_next
from stevora.ui.format import (
    COLLAPSE_LINES,
    cents,
    duration,
    json_inline,
    json_view,
    relative,
    schema_params,
    step_details,
    usd,
)


def test_durations_read_in_the_largest_sensible_unit() -> None:
    assert duration(None) == "—"
    assert duration(0.01) == "<0.1 ms"
    assert duration(0.4) == "0.4 ms"
    assert duration(85) == "85 ms"
    assert duration(1240) == "1.24 s"
    assert duration(12_345) == "12.3 s"
    assert duration(192_000) == "3 min 12 s"
    assert duration(7_500_000) == "2 h 05 min"


def test_costs_are_dollars_with_four_decimals_below_one_dollar() -> None:
    assert usd(0) == "$0"
    assert usd(0.00001) == "<$0.0001"
    assert usd(0.0123) == "$0.0123"
    assert usd(12.345) == "$12.35"
    assert cents(1.23) == "$0.0123"  # run totals are stored in cents


def test_relative_times_count_back_from_now() -> None:
    now = utcnow()
    assert relative(None) == "—"
    assert relative(now) == "just now"
    assert relative(now - timedelta(seconds=42)) == "42 s ago"
    assert relative(now - timedelta(minutes=5, seconds=3)) == "5 min ago"
    assert relative(now - timedelta(days=2, hours=1)) == "2 d ago"
    assert relative(now + timedelta(minutes=10, seconds=5)) == "in 10 min"


def test_long_json_is_marked_for_collapsing_with_a_preview() -> None:
    short = json_view({"city": "Lisbon"})
    assert not short.long and '"city": "Lisbon"' in short.text
    long = json_view({"events": list(range(COLLAPSE_LINES + 5)), "city": "Lisbon"})
    assert long.long and long.preview == "{ events, city }"
    assert json_view([1, 2, 3]).preview == "[ 3 items ]"


def test_tool_arguments_stored_as_a_json_string_are_shown_as_json() -> None:
    assert json_view('{"celsius": 21.5}').text == '{\n  "celsius": 21.5\n}'
    assert json_view("{not json").text == "{not json"


def test_short_payloads_fit_on_one_line_and_long_ones_do_not() -> None:
    assert json_inline({"stepName": "draft", "durationMs": 7}) == '{"stepName": "draft", "durationMs": 7}'
    assert json_inline({"text": "x" * 500}) is None


def test_tool_signatures_list_properties_with_type_and_optionality() -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"enum": ["c", "f"]},
            "n": {"type": ["integer", "null"]},
        },
        "required": ["city"],
    }
    assert schema_params(schema) == [
        ("city", "string", True),
        ("unit", '"c" | "f"', False),
        ("n", "integer | null", False),
    ]
    assert schema_params(None) == []


def test_definition_steps_are_summarised_by_what_they_do() -> None:
    llm = {"type": "llm", "name": "a", "model": "gpt-4o", "fallbackModels": ["claude-x"],
           "tools": ["search", {"name": "calc", "description": "d", "parameters": {}}]}  # fmt: skip
    assert step_details(llm)[:3] == [
        ("model", "gpt-4o → claude-x"),
        ("provider", "openai → anthropic (by model name; a run shows the provider that answered)"),
        ("tools", "search, calc"),
    ]
    assert ("provider", "scripted") in step_details({**llm, "provider": "scripted"})
    approval = {"type": "approval", "name": "r", "contentKey": "draft", "timeoutMs": 60_000}
    assert step_details(approval) == [("reviews", "state.draft"), ("timeout", "1 min")]


def test_csrf_tokens_are_bound_to_the_key() -> None:
    assert csrf_token_for("stv_a") == csrf_token_for("stv_a")
    assert csrf_token_for("stv_a") != csrf_token_for("stv_b")


def test_only_ui_paths_are_followed_after_login() -> None:
    assert safe_next("/ui/runs/wfrun_1") == "/ui/runs/wfrun_1"
    for bad in (
        None,
        "",
        "https://evil.example/ui/",
        "//evil.example/ui/",
        "/v1/workflow-runs",
        "/ui/\\evil",
    ):
        assert safe_next(bad) == "/ui/runs"
