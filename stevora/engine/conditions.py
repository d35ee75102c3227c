"""Condition steps: a dot path into run state, coerced with JavaScript `Boolean()` semantics."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from stevora.engine.templating import _MISSING, lookup


def js_truthy(value: Any) -> bool:
    """`Boolean(value)` in JavaScript: `{}` and `[]` are truthy; 0, NaN, "", null, false are not."""
    if value is _MISSING or value is None or value is False:
        return False
    if isinstance(value, bool):
        return True
    if isinstance(value, int | float):
        return value != 0 and not (isinstance(value, float) and math.isnan(value))
    if isinstance(value, str):
        return value != ""
    return True  # objects and arrays, empty or not


def evaluate(expression: str, state: Mapping[str, Any]) -> bool:
    """Walk `expression` (`a.b.c`) into state; a missing key at any depth is falsy, never an error."""
    path = expression.strip()
    if path.startswith("state."):
        path = path[len("state.") :]
    return js_truthy(lookup(state, path.split(".")))
