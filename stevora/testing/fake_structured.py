"""Structured outputs on the fake provider servers, as the real APIs treat them.

* A strict `json_schema` response format (OpenAI Chat Completions' `response_format`, the
  Responses API's `text.format`) or an `output_config.format` (Anthropic) whose
  schema the real API refuses gets its 400, in its words: an object without `additionalProperties:
  false`, (OpenAI) a property missing from `required`, a keyword the mode does not support.
* An answer to such a request matches its schema: a scripted answer that does not is a mistake in
  the test (a real strict-mode answer always does), answered 500 naming it.

These rules are written from the providers' documentation independently of
`stevora.definitions.output_schema`, so a test of Stevora's fix-ups is not checked by the same code.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jsonschema.validators import validator_for

# Keywords each strict mode accepts (OpenAI "Supported schemas"; Anthropic structured outputs).
_OPENAI_KEYWORDS = frozenset(
    "type properties required additionalProperties items enum const anyOf $ref $defs definitions "
    "description title pattern format minimum maximum exclusiveMinimum exclusiveMaximum multipleOf "
    "minItems maxItems".split()
)
_ANTHROPIC_KEYWORDS = frozenset(
    "type properties required additionalProperties items enum const anyOf allOf $ref $defs definitions "
    "description title format minItems default".split()
)
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Where a node's sub-schemas live: a map of them, one, or a list.
_MAPS, _ONE, _LISTS = ("properties", "$defs", "definitions"), ("items",), ("anyOf", "allOf")


def _openai_spec(kind: str, body: dict[str, Any]) -> tuple[str, Any] | None:
    """Where an OpenAI request says its `json_schema` format, and the spec: Chat Completions'
    `response_format.json_schema` or the Responses API's `text.format` (name, schema and strict
    on the format itself); `None` without one."""
    if kind == "openai":
        fmt = body.get("response_format") or {}
        return ("response_format", fmt.get("json_schema")) if fmt.get("type") == "json_schema" else None
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return "text.format", fmt
    return None


def strict_schema_of(kind: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a request holds its answer to natively, if it asks for one."""
    if kind in ("openai", "responses"):
        found = _openai_spec(kind, body)
        spec = found[1] if found is not None else None
        if isinstance(spec, dict) and spec.get("strict") is True and isinstance(spec.get("schema"), dict):
            return dict(spec["schema"])
        return None
    fmt = (body.get("output_config") or {}).get("format")
    if isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict):
        return dict(fmt["schema"])
    return None


def structured_problem(kind: str, body: dict[str, Any]) -> str | None:
    """The 400 the real API answers to the request's structured-output form, or None."""
    if kind in ("openai", "responses"):
        found = _openai_spec(kind, body)
        if found is None:
            return None
        place, spec = found
        if not isinstance(spec, dict) or not _NAME.match(str(spec.get("name", ""))):
            name = "response_format.json_schema.name" if kind == "openai" else "text.format.name"
            return f"Invalid '{name}': must match ^[a-zA-Z0-9_-]{{1,64}}$"
        if spec.get("strict") is not True:
            return None
        schema = spec.get("schema")
        where = f"Invalid schema for {place} '{spec['name']}'"
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return f"{where}: schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{(schema or {}).get('type')}\"'."
        problem = _node_problem(schema, (), _OPENAI_KEYWORDS, all_required=True)
        return f"{where}: {problem}" if problem else None
    fmt = (body.get("output_config") or {}).get("format")
    if fmt is None:
        return None
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        return "output_config.format: Input should be {'type': 'json_schema', 'schema': {...}}"
    problem = _node_problem(fmt["schema"], (), _ANTHROPIC_KEYWORDS, all_required=False)
    return f"output_config.format.schema: {problem}" if problem else None


def _node_problem(
    node: Any, context: tuple[str, ...], keywords: frozenset[str], *, all_required: bool
) -> str | None:
    if not isinstance(node, dict):
        return None
    for key in node:
        if key not in keywords:
            return f"In context={context}, '{key}' is not permitted."
    kind = node.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        if node.get("additionalProperties") is not False:
            return f"In context={context}, 'additionalProperties' is required to be supplied and to be false."
        if all_required:
            missing = [k for k in node.get("properties") or {} if k not in (node.get("required") or [])]
            if missing:
                return (
                    f"In context={context}, 'required' is required to be supplied and to be an array "
                    f"including every key in properties. Missing '{missing[0]}'."
                )
    for key in _MAPS:
        for name, sub in (node.get(key) or {}).items():
            found = _node_problem(sub, (*context, key, name), keywords, all_required=all_required)
            if found:
                return found
    for key in _ONE:
        found = _node_problem(node.get(key), (*context, key), keywords, all_required=all_required)
        if found:
            return found
    for key in _LISTS:
        for i, sub in enumerate(node.get(key) or ()):
            found = _node_problem(sub, (*context, key, str(i)), keywords, all_required=all_required)
            if found:
                return found
    return None


def answer_mismatch(kind: str, body: dict[str, Any], answer: dict[str, Any]) -> str | None:
    """Why a scripted 200 answer could not have come from the real API for this request."""
    schema = strict_schema_of(kind, body)
    if schema is None:
        return None
    if kind == "openai":
        choices = answer.get("choices") or [{}]
        text = (choices[0].get("message") or {}).get("content")
        if text is None:  # a tool call round (or a refusal) carries no text to hold
            return None
    elif kind == "responses":
        texts = [
            part.get("text", "")
            for item in answer.get("output") or ()
            if item.get("type") == "message"
            for part in item.get("content") or ()
            if part.get("type") == "output_text"
        ]
        if not texts:
            return None
        text = "".join(texts)
    else:
        texts = [b.get("text", "") for b in answer.get("content") or () if b.get("type") == "text"]
        if not texts:
            return None
        text = "".join(texts)
    try:
        value = json.loads(text)
    except ValueError:
        return f"the scripted answer is not JSON, but the request asks for a strict schema: {text[:200]!r}"
    errors = [e.message for e in validator_for(schema)(schema).iter_errors(value)]
    if errors:
        return f"the scripted answer does not match the request's strict schema: {errors[0]}"
    return None
