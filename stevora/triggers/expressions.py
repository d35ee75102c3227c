"""CEL expressions over an event (a trigger's `if`, a debounce `key`, a waiting step's `match`).

Compiled once per source text (`cel`, the common-expression-language package). The expression
sees the event's fields directly: `name`, `data`, `id`, `ts` (ISO 8601 text); a waiting step's
`match` also sees the run's `input` and `state`. An expression that fails at evaluation (a
missing key, a type mismatch) is false for a condition: a hostile or odd event never breaks
the request that brought it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import cel
import structlog

from stevora.definitions.triggers import check_expression

log = structlog.get_logger("stevora.triggers")


@lru_cache(maxsize=1024)
def _program(source: str) -> Any:
    check_expression(source)
    return cel.compile(source)


def event_context(row: Any) -> dict[str, Any]:
    """What an expression (and an `{{event.x}}` template) sees of a stored event."""
    return {"name": row["name"], "data": row["data"], "id": row["event_key"], "ts": row["ts"].isoformat()}


def evaluate(source: str, context: dict[str, Any]) -> Any:
    """The expression's value; raises ValueError when it cannot be evaluated."""
    try:
        return _program(source).execute(context)
    except (KeyError, TypeError, RuntimeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{source!r}: {exc}") from None


def holds(source: str, context: dict[str, Any]) -> bool:
    """True only when the expression evaluates to `true` (an error or a non-boolean is false)."""
    try:
        return evaluate(source, context) is True
    except ValueError as exc:
        log.info("trigger_expression_false", reason=str(exc)[:200])
        return False


def key_of(source: str, context: dict[str, Any]) -> str:
    """A debounce key's value as text (JSON of what it evaluates to; `null` when it fails)."""
    try:
        value = evaluate(source, context)
    except ValueError:
        value = None
    return json.dumps(value, sort_keys=True, default=str)
