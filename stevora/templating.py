"""`{{input.x}}` / `{{state.a.b}}` / `{{name}}` placeholders in prompts and messages.

* `input.` and `state.` read the run input and state; a bare name looks in state, then input.
* Dot paths walk nested objects; a numeric segment indexes a list (`{{state.items.0.title}}`).
* Strings render as-is; everything else renders as compact JSON.
* A missing key renders as an empty string. The rendered text is stored with the LLM call
  (llm_calls.request), so what the model actually saw is always visible in the trace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_$.\-]+)\s*\}\}")
MISSING = object()


def lookup(root: Any, path: list[str]) -> Any:
    """Walk `path` into nested dicts/lists; `MISSING` when any segment is absent."""
    cur = root
    for seg in path:
        if isinstance(cur, Mapping):
            if seg not in cur:
                return MISSING
            cur = cur[seg]
        elif isinstance(cur, list) and seg.isdigit() and int(seg) < len(cur):
            cur = cur[int(seg)]
        else:
            return MISSING
    return cur


def resolve(
    expr: str,
    *,
    input: Mapping[str, Any],
    state: Mapping[str, Any],
    steps: Mapping[str, Any] | None = None,
    scope: Mapping[str, Any] | None = None,
) -> Any:
    """`scope`: extra roots read before the others (a `map` step's `item` and `index`)."""
    parts = expr.split(".")
    head, rest = parts[0], parts[1:]
    if scope is not None and head in scope:
        return lookup(scope[head], rest)
    if head == "input":
        return lookup(input, rest)
    if head == "state":
        return lookup(state, rest)
    if head == "steps" and steps is not None:
        return lookup(steps, rest)
    value = lookup(state, parts)
    return lookup(input, parts) if value is MISSING else value


def _render_value(value: Any) -> str:
    if value is MISSING or value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render_template(text: str, *, input: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    if "{{" not in text:
        return text
    return _PLACEHOLDER.sub(lambda m: _render_value(resolve(m.group(1), input=input, state=state)), text)


_EXACT = re.compile(r"^\{\{\s*([A-Za-z0-9_$.\-]+)\s*\}\}$")


class MissingTemplatePath(LookupError):
    """A value that is exactly one template names a path that does not exist."""

    def __init__(self, path: str, field: str) -> None:
        super().__init__(f"{field}: '{{{{{path}}}}}' names nothing (no such path in the run)")
        self.path = path
        self.field = field


def render_typed(
    value: Any,
    *,
    input: Mapping[str, Any],
    state: Mapping[str, Any],
    steps: Mapping[str, Any] | None = None,
    field: str = "input",
    scope: Mapping[str, Any] | None = None,
) -> Any:
    """Render the templates in a JSON value (a `tool` step's `input`). A string that is exactly one
    template keeps the JSON type of what it names, and a missing path raises MissingTemplatePath
    naming the field; templates inside longer strings render as in prompts. `steps.<name>.output.x`
    reads the output of an earlier step. Environment variables are deliberately not templatable."""
    if isinstance(value, str):
        exact = _EXACT.match(value)
        if exact is None:
            if "{{" not in value:
                return value
            return _PLACEHOLDER.sub(
                lambda m: _render_value(
                    resolve(m.group(1), input=input, state=state, steps=steps, scope=scope)
                ),
                value,
            )
        found = resolve(exact.group(1), input=input, state=state, steps=steps, scope=scope)
        if found is MISSING:
            raise MissingTemplatePath(exact.group(1), field)
        return found
    if isinstance(value, dict):
        return {
            k: render_typed(v, input=input, state=state, steps=steps, field=f"{field}.{k}", scope=scope)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            render_typed(v, input=input, state=state, steps=steps, field=f"{field}[{i}]", scope=scope)
            for i, v in enumerate(value)
        ]
    return value
