"""Post-completion checks on an llm step's final answer (docs/tool-calling.md, "Guardrails").

* The answer is parsed as JSON when the step has `responseFormat: "json"` or an `outputSchema`
  (`extract_json` accepts clean JSON, fenced JSON and JSON inside prose).
* `outputSchema` is checked whenever present. Two shapes are accepted: a full JSON Schema
  (`{"type": "object", "properties": ...}`) validated as such, or the documented flat map of
  top-level field → schema, where every key is required and each value is validated.
* `schema_validation`: the JSON parse + schema check above, reported as that check.
* `content_safety`: config `blocklist` (case-insensitive terms), `patterns` (regexes), and
  `secrets` (default true: API keys, private keys, AWS ids must not leak into output).
* `confidence_threshold`: config `field` (dot path in the JSON answer, default `confidence`)
  and `min` (default 0.5); missing or lower fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema.validators import validator_for

from stevora.definitions import LlmStep
from stevora.templating import MISSING, lookup

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_SECRET_PATTERNS = {
    "openai_key": re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),
    "anthropic_key": re.compile(r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
    "stevora_key": re.compile(r"\bstv_[a-z0-9]{32}\b"),
    "aws_access_key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "private_key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
}


@dataclass(frozen=True, slots=True)
class Parsed:
    value: Any  # the parsed JSON, or None
    error: str | None


@dataclass(frozen=True, slots=True)
class Violation:
    check: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "message": self.message}


def extract_json(text: str) -> Any:
    """Parse JSON from clean text, a ``` fence, or the first balanced object/array in prose."""
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    for match in _FENCE.finditer(text):
        try:
            return json.loads(match.group(1).strip())
        except ValueError:
            continue
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                value, _ = decoder.raw_decode(text, i)
                return value
            except ValueError:
                continue
    raise ValueError("Response is not valid JSON")


def parse_output(text: str, step: LlmStep) -> Parsed:
    if step.response_format != "json" and not step.output_schema:
        return Parsed(None, None)
    try:
        return Parsed(extract_json(text), None)
    except ValueError:
        return Parsed(None, "Response is not valid JSON")


def _is_full_schema(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "object" or "properties" in schema or "$schema" in schema


def schema_problems(value: Any, schema: dict[str, Any]) -> list[str]:
    if _is_full_schema(schema):
        validator = validator_for(schema)(schema)
        return [
            f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in validator.iter_errors(value)
        ]
    if not isinstance(value, dict):
        return ["(root): expected a JSON object"]
    problems = [f"missing required field '{key}'" for key in schema if key not in value]
    for key, sub in schema.items():
        if key in value and isinstance(sub, dict) and sub:
            validator = validator_for(sub)(sub)
            problems += [f"{key}: {e.message}" for e in validator.iter_errors(value[key])]
    return problems


def _schema_check(step: LlmStep, parsed: Parsed, check_name: str) -> list[Violation]:
    if parsed.error is not None:
        return [Violation(check_name, parsed.error)]
    if step.output_schema:
        return [Violation(check_name, p) for p in schema_problems(parsed.value, step.output_schema)]
    return []


def _content_safety(text: str, config: dict[str, Any]) -> list[Violation]:
    found: list[Violation] = []
    lowered = text.lower()
    for term in config.get("blocklist") or ():
        if str(term).lower() in lowered:
            found.append(Violation("content_safety", f"Response contains blocked term '{term}'"))
    for pattern in config.get("patterns") or ():
        if re.search(str(pattern), text):
            found.append(Violation("content_safety", f"Response matches blocked pattern /{pattern}/"))
    if config.get("secrets", True):
        for name, regex in _SECRET_PATTERNS.items():
            if regex.search(text):
                found.append(Violation("content_safety", f"Response appears to contain a secret ({name})"))
    return found


def _confidence(parsed: Parsed, config: dict[str, Any]) -> list[Violation]:
    field = str(config.get("field", "confidence"))
    minimum = float(config.get("min", config.get("threshold", 0.5)))
    value = lookup(parsed.value, field.split(".")) if isinstance(parsed.value, dict) else MISSING
    if value is MISSING or not isinstance(value, int | float) or isinstance(value, bool):
        return [Violation("confidence_threshold", f"Response has no numeric '{field}' field")]
    if value < minimum:
        return [Violation("confidence_threshold", f"Confidence {value} is below the threshold {minimum}")]
    return []


def check(step: LlmStep, text: str, parsed: Parsed) -> list[Violation]:
    """Every violation of the step's output contract and configured post-checks."""
    configured = step.guardrails.post_checks if step.guardrails else []
    names = {c.type for c in configured}
    violations: list[Violation] = []
    if "schema_validation" not in names and (step.response_format == "json" or step.output_schema):
        violations += _schema_check(step, parsed, "output_schema")
    for c in configured:
        if c.type == "schema_validation":
            if step.output_schema or step.response_format == "json":
                violations += _schema_check(step, parsed, "schema_validation")
        elif c.type == "content_safety":
            violations += _content_safety(text, dict(c.config))
        elif c.type == "confidence_threshold":
            violations += _confidence(parsed, dict(c.config))
    return violations


def feedback_message(violations: list[Violation]) -> str:
    lines = "\n".join(f"- {v.check}: {v.message}" for v in violations)
    return f"Your previous answer failed these checks:\n{lines}\nPlease answer again, fixing every problem."
