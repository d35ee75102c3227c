"""Checks on a run input typed into the UI before a run is created from it.

The API takes any JSON object; the UI also catches the mistakes a person makes in a text box:
text that is not JSON, JSON that is not an object, and an object without a key that the
definition's templates read as `{{input.<key>}}` (the step would render an empty string).
"""

from __future__ import annotations

import json
import re
from typing import Any

from stevora.errors import ValidationError

_INPUT_REF = re.compile(r"\{\{\s*input\.([A-Za-z0-9_$\-]+)")


def input_references(value: Any, path: str = "steps") -> dict[str, str]:
    """`{key: where}` for each top-level input key that a template in `value` reads."""
    found: dict[str, str] = {}
    if isinstance(value, str):
        for match in _INPUT_REF.finditer(value):
            found.setdefault(match.group(1), path)
    elif isinstance(value, dict):
        for key, sub in value.items():
            for ref, where in input_references(sub, f"{path}.{key}").items():
                found.setdefault(ref, where)
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            for ref, where in input_references(sub, f"{path}[{index}]").items():
                found.setdefault(ref, where)
    return found


def json_object(text: str, field: str) -> dict[str, Any]:
    """The JSON object typed into a form field (empty text: `{}`), or `ValidationError` naming it."""
    stripped = text.strip()
    if not stripped:
        return {}
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past what json parses
        raise ValidationError.from_problems([{"path": field, "message": f"not valid JSON: {exc}"}]) from None
    if not isinstance(value, dict):
        raise ValidationError.from_problems(
            [{"path": field, "message": f"must be a JSON object, got {type(value).__name__}"}]
        )
    return value


def parse_run_input(text: str, definition_steps: Any) -> dict[str, Any]:
    """The input object, or `ValidationError` whose problems name the field (`input`, `input.city`)."""
    value = json_object(text, "input")
    missing = [
        {"path": f"input.{key}", "message": f"missing; the definition reads it at {where}"}
        for key, where in input_references(definition_steps).items()
        if key not in value
    ]
    if missing:
        raise ValidationError.from_problems(missing)
    return value
