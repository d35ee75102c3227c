"""Dagu's `defaultParams` string → a JSON Schema for a workflow's input.

`"query max_results=10 include_images=false temperature=0.7"` becomes an object schema where a
bare name is a required string and `name=value` is an optional property whose type and `default`
come from the value: integer, number, boolean, `[]`-style array, `{}`-style object, or string (a
quoted value is always a string). See docs/definitions.md, "The run input".
"""

from __future__ import annotations

import json
import re
from typing import Any

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TOKEN = re.compile(
    rf"""\s*(?P<name>{_NAME})(?:=(?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\S+))?(?=\s|$)"""
)
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?$")


class ParamsError(ValueError):
    """`defaultParams` could not be parsed; the message says where."""


def _typed(raw: str) -> tuple[str, Any]:
    if raw[0] in "\"'":
        body = raw[1:-1]
        return "string", json.loads(f'"{body}"') if raw[0] == '"' else body.replace("\\'", "'")
    if raw in ("true", "false"):
        return "boolean", raw == "true"
    if _INT.match(raw):
        return "integer", int(raw)
    if _FLOAT.match(raw):
        return "number", float(raw)
    if raw[0] in "[{":
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise ParamsError(
                f"'{raw}' is not a valid JSON {'array' if raw[0] == '[' else 'object'}"
            ) from exc
        return ("array" if isinstance(value, list) else "object"), value
    return "string", raw


def parse_default_params(text: str) -> dict[str, Any]:
    """The JSON Schema `text` describes; `ParamsError` naming the bad part otherwise."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    position = 0
    stripped = text.rstrip()
    while position < len(stripped):
        match = _TOKEN.match(stripped, position)
        if match is None:
            rest = stripped[position:].strip().split()[0]
            raise ParamsError(f"cannot read parameter '{rest}': expected NAME or NAME=VALUE")
        name, raw = match.group("name"), match.group("value")
        if name in properties:
            raise ParamsError(f"parameter '{name}' is given twice")
        if raw is None:
            properties[name] = {"type": "string"}
            required.append(name)
        else:
            kind, value = _typed(raw)
            properties[name] = {"type": kind, "default": value}
        position = match.end()
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema
