"""An `llm` step's `outputSchema` as the providers' native structured-output modes take it.

OpenAI's strict `json_schema` and Anthropic's `output_config.format` accept a subset of JSON
Schema (docs/providers.md, "Structured outputs"). `native_schema` makes the provider's form of a
step's schema, by rules that never let the provider produce an answer the step's own schema
refuses, because the answer is still checked against the original schema afterwards:

* loosening is safe: a keyword the provider does not take (`minLength`, `uniqueItems`, `not`,
  ...) is moved into the node's `description` (the model still reads it; the check enforces it);
  annotations (`default`, `examples`, `$comment`, ...) are dropped; `oneOf` becomes `anyOf`;
* tightening that keeps every answer valid is safe: an object without `additionalProperties`
  gets `additionalProperties: false`;
* what cannot be fixed either way is a `SchemaProblem` naming the node: an open object
  (`additionalProperties` true or a schema, `patternProperties`), an optional property under
  OpenAI's strict mode (it wants every property in `required`), a root that is not an object.

The step definition refuses a problem when it asks for `structuredOutput: "native"` outright (400
naming the field); by default (no `structuredOutput`) the adapter falls back to the forced
final-answer tool and says so on the call's `LLM_CALL_COMPLETED` event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

StructuredOutput = Literal["native", "tool", "prompt"]
Dialect = Literal["openai", "anthropic"]

FINAL_ANSWER_TOOL = "final_answer"
"""The tool the model calls to give its answer in `tool` mode (reserved: a step with an
`outputSchema` cannot declare a tool of this name)."""

_STRUCTURE = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf"}
)
_REFS = frozenset({"$ref", "$defs", "definitions"})
_TEXT = frozenset({"description", "title"})
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly"}
)
# What each strict mode takes on top of the common structure (OpenAI's supported-schemas list;
# Anthropic's structured-outputs limits: no numeric or length bounds, `minItems` 0 or 1 only).
_ALLOWED: dict[Dialect, frozenset[str]] = {
    "openai": _STRUCTURE
    | _REFS
    | _TEXT
    | {"pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    | {"multipleOf", "minItems", "maxItems"},
    "anthropic": _STRUCTURE | _REFS | _TEXT | {"allOf", "format", "minItems"},
}
_ANTHROPIC_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
)
_OPEN_OBJECT_KEYS = ("patternProperties", "unevaluatedProperties")

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """Why a provider's strict mode cannot take a schema, at `path` inside `outputSchema`."""

    path: Path
    message: str


def full_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema a step's `outputSchema` stands for: itself, or an object schema for the
    documented flat map of field → schema (every field required)."""
    if schema.get("type") == "object" or "properties" in schema or "$schema" in schema:
        return schema
    return {
        "type": "object",
        "properties": {key: (sub if isinstance(sub, dict) else {}) for key, sub in schema.items()},
        "required": list(schema),
    }


def native_schema(
    schema: dict[str, Any], dialect: Dialect
) -> tuple[dict[str, Any] | None, SchemaProblem | None]:
    """The provider's strict form of `schema` (a step's `outputSchema`), or the first problem."""
    full = full_schema(schema)
    if not _is_object(full):
        return None, SchemaProblem(
            (), 'the root of a native structured output must be an object ("type": "object")'
        )
    try:
        return _Fixer(dialect).node(full, ()), None
    except _Unfixable as exc:
        return None, exc.problem


def native_problems(schema: dict[str, Any]) -> list[SchemaProblem]:
    """What keeps `schema` from either provider's native mode (the definition check)."""
    problems = []
    for dialect in ("openai", "anthropic"):
        _, problem = native_schema(schema, dialect)
        if problem is not None and problem not in problems:
            problems.append(problem)
    return problems


def tool_problems(schema: dict[str, Any]) -> list[SchemaProblem]:
    """What keeps `schema` from being a final-answer tool's parameters: they must be an object."""
    if _is_object(full_schema(schema)):
        return []
    return [SchemaProblem((), 'a final-answer tool takes an object schema ("type": "object")')]


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return (
        kind == "object"
        or (isinstance(kind, list) and "object" in kind)
        or (kind is None and "properties" in node)
    )


class _Unfixable(Exception):
    def __init__(self, problem: SchemaProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


class _Fixer:
    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.allowed = _ALLOWED[dialect]

    def node(self, node: Any, path: Path) -> Any:
        if not isinstance(node, dict):
            return node  # `true`/`false` schemas and malformed values: left to the provider
        out: dict[str, Any] = {}
        moved: dict[str, Any] = {}
        for key, value in node.items():
            if key in _ANNOTATIONS:
                continue
            if key == "oneOf":  # one-of loosened to any-of: the check still wants exactly one
                key = "anyOf"
            if key not in self.allowed or not self._value_allowed(key, value):
                if key in _OPEN_OBJECT_KEYS:
                    raise _Unfixable(
                        SchemaProblem((*path, key), f"{key} makes an open object, which strict mode refuses")
                    )
                moved[key] = value
                continue
            out[key] = value
        if _is_object(node):
            self._close_object(node, out, path)
        for key in ("items",):
            if isinstance(out.get(key), dict):
                out[key] = self.node(out[key], (*path, key))
        for key in ("anyOf", "allOf"):
            if isinstance(out.get(key), list):
                out[key] = [self.node(sub, (*path, key, i)) for i, sub in enumerate(out[key])]
        for key in ("$defs", "definitions"):
            if isinstance(out.get(key), dict):
                out[key] = {name: self.node(sub, (*path, key, name)) for name, sub in out[key].items()}
        if moved:
            said = ", ".join(f"{key}: {json.dumps(value, default=str)}" for key, value in moved.items())
            text = out.get("description")
            out["description"] = f"{text}\n\n{{{said}}}" if isinstance(text, str) and text else f"{{{said}}}"
        return out

    def _value_allowed(self, key: str, value: Any) -> bool:
        if self.dialect == "anthropic":
            if key == "format":
                return value in _ANTHROPIC_FORMATS
            if key == "minItems":
                return value in (0, 1)
        return True

    def _close_object(self, node: dict[str, Any], out: dict[str, Any], path: Path) -> None:
        extra = node.get("additionalProperties", False)
        if extra is not False:
            raise _Unfixable(
                SchemaProblem(
                    (*path, "additionalProperties"),
                    "strict mode needs a closed object (additionalProperties: false)",
                )
            )
        out["additionalProperties"] = False
        properties = node.get("properties") or {}
        if not isinstance(properties, dict):
            return
        required = node.get("required") or []
        if self.dialect == "openai":
            for name in properties:
                if name not in required:
                    raise _Unfixable(
                        SchemaProblem(
                            (*path, "properties", name),
                            f"property '{name}' is optional; OpenAI's strict mode needs every property "
                            'in "required" (give it a null type if it may be absent)',
                        )
                    )
        out["properties"] = {
            name: self.node(sub, (*path, "properties", name)) for name, sub in properties.items()
        }
        if "properties" not in node:
            out["properties"] = {}
            out.setdefault("required", [])
