"""The per-field input limits, checked by the commands before they write (docs/security.md).

The API's edge checks whole request bodies (`stevora.api.limits`); these checks know which field
a value is and hold for every way in (API, web UI forms, the embedded engine): a value that
cannot be stored exactly is an `UnstorableValue` naming its path, one over its size limit a
`PayloadTooLarge`, and a merge that would grow the run's state past `max_state_bytes` a
`StateTooLarge`. They read only the values in hand, never the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stevora.errors import PayloadTooLarge, StateTooLarge, UnstorableValue, ValidationError
from stevora.settings import Settings
from stevora.storable import encoded_size, problem_in_sent, problem_in_value
from stevora.tasks import StepResult


def check_value(settings: Settings, value: Any, field: str) -> None:
    """Raise `UnstorableValue` when `value` (given as `field`) cannot be stored exactly (NUL too:
    the database would hold U+FFFD in its place). The one check of every value a client sends,
    whichever way in (API edge and fields, web UI forms)."""
    problem = problem_in_sent(value, max_depth=settings.max_json_depth, root=field)
    if problem is not None:
        raise UnstorableValue.of(problem.code, problem.path, problem.message)


def check_sized(settings: Settings, value: Any, field: str, limit: int, setting: str) -> None:
    """`check_value`, then `PayloadTooLarge` when its JSON is over `limit` bytes."""
    check_value(settings, value, field)
    size = encoded_size(value)
    if size > limit:
        raise PayloadTooLarge.field(field, size, limit, setting)


def check_run_input(settings: Settings, input: Any) -> None:
    check_sized(settings, input, "input", settings.max_run_input_bytes, "STEVORA_MAX_RUN_INPUT_BYTES")


def check_definition(settings: Settings, body: Any, field: str) -> None:
    """A definition as sent (`field`: `body` for `POST /workflow-definitions`, `definition` inline)."""
    check_value(settings, body, "" if field == "body" else field)
    size = encoded_size(body)
    if size > settings.max_definition_bytes:
        raise PayloadTooLarge.field(
            field, size, settings.max_definition_bytes, "STEVORA_MAX_DEFINITION_BYTES"
        )
    check_tool_round_ceiling(settings, body, "" if field == "body" else f"{field}.")


def check_tool_round_ceiling(settings: Settings, body: Any, prefix: str) -> None:
    """An `llm` step's `maxToolRounds` above this server's STEVORA_MAX_TOOL_ROUNDS is a 400 naming
    the field (the definition's own schema only bounds it by the largest ceiling a server may set)."""
    steps = body.get("steps") if isinstance(body, Mapping) else None
    if not isinstance(steps, list):
        return  # the definition's validation reports it
    ceiling = settings.max_tool_rounds
    problems = [
        {
            "path": f"{prefix}steps[{index}].maxToolRounds",
            "message": f"{step['maxToolRounds']} is above this server's ceiling of {ceiling} rounds "
            "(STEVORA_MAX_TOOL_ROUNDS)",
        }
        for index, step in enumerate(steps)
        if isinstance(step, Mapping)
        and isinstance(step.get("maxToolRounds"), int)
        and not isinstance(step.get("maxToolRounds"), bool)
        and step["maxToolRounds"] > ceiling
    ]
    if problems:
        raise ValidationError.from_problems(problems)


def merged_state_problem(
    settings: Settings, state: Mapping[str, Any] | None, updates: Mapping[str, Any] | None
) -> StateTooLarge | None:
    """The error a shallow merge of `updates` into `state` would be refused with, or None."""
    if not updates:
        return None
    limit = settings.max_state_bytes
    merged = {**(state or {}), **updates}
    size = encoded_size(merged)
    if size <= limit:
        return None
    return StateTooLarge(
        f"The run's state would be {size} bytes after this merge, over the {limit}-byte limit "
        "(STEVORA_MAX_STATE_BYTES); nothing was merged",
        details={"bytes": size, "limitBytes": limit, "keys": sorted(updates)[:20]},
    )


def check_state_merge(
    settings: Settings, state: Mapping[str, Any] | None, updates: Mapping[str, Any] | None
) -> None:
    problem = merged_state_problem(settings, state, updates)
    if problem is not None:
        raise problem


def checked_result(settings: Settings, state: Mapping[str, Any], result: StepResult) -> StepResult:
    """A completed step's result, or a failed one (not retried) when its output or state updates
    cannot be stored exactly, or its state updates would grow the state past `max_state_bytes`
    (checked against the state the step started with). Nothing of a refused result is written."""
    if result.status != "completed":
        return result
    depth = settings.max_json_depth
    for value, root in ((result.output, "output"), (result.state_updates, "stateUpdates")):
        problem = problem_in_value(value, max_depth=depth, root=root) if value else None
        if problem is not None:
            message = f"The step's {root} cannot be stored: {problem.path}: {problem.message}"
            error = {"code": problem.code, "message": message, "details": {"path": problem.path}}
            return StepResult(status="failed", error=error, retryable=False)
    too_large = merged_state_problem(settings, state, result.state_updates)
    if too_large is not None:
        return StepResult(status="failed", error=too_large.to_dict(), retryable=False)
    return result
