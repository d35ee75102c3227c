"""Plausible, deterministic tool arguments for the offline `scripted` model.

The scripted provider is what a newcomer sees first, so its tool calls should read like a model's:
a `city` is a place named in the conversation (not the whole question), an `amount` is the order's
amount found in it (not 1), a currency one of its enum values the conversation mentions. Values
come, in this order, from: `const`; a `"name": value` pair in the conversation (a tool result, or
state rendered into the prompt); the schema's `default`; an enum value the conversation mentions;
and then rules by type, format and property name. Numbers stay within the schema's bounds, strings
within its lengths. The same conversation always gives the same arguments.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_STRING_SEED_CHARS = 60
_FALLBACK_PLACE = "Lisbon"

# An id-looking token: `cus_42`, `order-1234`, `A1B2C3`.
_ID_TOKEN = re.compile(r"\b[A-Za-z]+[_-][A-Za-z0-9_-]+\b|\b(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{4,}\b")
# A standalone number (not part of an id such as `cus_42` or `v2`).
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.]\w)")
# A capitalised place after a preposition ("in Rome", "to New York"), or any capitalised word that
# does not start a sentence.
_PLACE_AFTER = re.compile(
    r"\b(?:in|at|to|from|near|for|of|around)\s+((?:[A-Z][a-zà-ÿ]+)(?:\s+[A-Z][a-zà-ÿ]+)?)"
)
_CAPITALISED = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][a-zà-ÿ]{2,})\b")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_URL = re.compile(r"https?://[^\s\"'<>]+")
_CURRENCY = re.compile(r"\b[A-Z]{3}\b")
_QUOTED = re.compile(r"[\"“']([^\"”']{2,40})[\"”']")
# The thing after a verb of getting: "Add oat milk and eggs" → "oat milk".
_THING_AFTER_VERB = re.compile(
    r"\b(?:add|buy|get|put|order|need|find)\s+(?:some\s+|an?\s+|the\s+)?([a-z][a-z -]{1,30}?)"
    r"(?=\s+(?:and|to|on|for|then|from|please)\b|[,.!?;]|$)",
    re.IGNORECASE,
)

_PLACE_NAMES = ("city", "location", "place", "destination", "town", "country", "region")
_AMOUNT_NAMES = ("amount", "price", "total", "cost", "sum", "value")
_FORMAT_EXAMPLES = {
    "date": "2026-01-15",
    "date-time": "2026-01-15T09:30:00Z",
    "time": "09:30:00",
    "email": "customer@example.com",
    "uri": "https://example.com",
    "url": "https://example.com",
    "uuid": "123e4567-e89b-42d3-a456-426614174000",
    "ipv4": "192.0.2.1",
    "hostname": "example.com",
}
# Words that name something a person would not want done unasked: the first round leaves tools
# named with them out unless the prompt uses the word (a list is not emptied after being filled).
_DESTRUCTIVE = ("remove", "delete", "clear", "drop", "cancel", "revoke", "reset", "purge", "empty")


@dataclass(frozen=True)
class Seed:
    """What the arguments are drawn from: the last user message, and the whole conversation's
    text (user messages and tool results), where `"key": value` pairs are looked up."""

    prompt: str = ""
    conversation: str = ""


def leaves_out(tool_name: str, prompt: str) -> bool:
    """Whether the first round skips this tool: its name says it destroys, the prompt does not ask."""
    name, asked = tool_name.lower(), prompt.lower()
    return any(word in name and word not in asked for word in _DESTRUCTIVE)


def synthesize_value(schema: Any, seed: Seed | str = "", name: str = "") -> Any:
    """A value that fits a JSON Schema and looks like what a model would send for `name`."""
    if isinstance(seed, str):
        seed = Seed(seed, seed)
    if not isinstance(schema, dict):
        return "example"
    if "const" in schema:
        return schema["const"]
    found = _from_conversation(name, schema, seed.conversation) if name else None
    if found is not None:
        return found
    if "default" in schema:
        return schema["default"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return _mentioned_choice(schema["enum"], seed.conversation)
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return synthesize_value(options[0], seed, name)
    kind = _kind(schema)
    if kind == "string":
        return _fit_length(_string_value(name, schema, seed), schema)
    if kind in ("integer", "number"):
        return _number_value(name, schema, seed, integer=kind == "integer")
    if kind == "boolean":
        return True
    if kind == "array":
        return _array_value(name, schema, seed)
    if kind == "null":
        return None
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {key: synthesize_value(sub, seed, key) for key, sub in properties.items()}
    return "example"


def _kind(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and isinstance(schema.get("properties"), dict):
        kind = "object"
    return kind


def _from_conversation(name: str, schema: dict[str, Any], text: str) -> Any:
    """The value of a `"name": value` (or `name=value`) pair in the text, if it fits the schema."""
    match = re.search(
        rf"[\"']?\b{re.escape(name)}[\"']?\s*[:=]\s*(\"[^\"]*\"|-?\d+(?:\.\d+)?|true|false)", text
    )
    if match is None:
        return None
    try:
        value = json.loads(match.group(1))
    except ValueError:
        return None
    kind = _kind(schema)
    if isinstance(schema.get("enum"), list) and value not in schema["enum"]:
        return None
    if kind == "string" and isinstance(value, str) and value:
        return value
    if kind in ("integer", "number") and isinstance(value, int | float) and not isinstance(value, bool):
        if kind == "integer" and value != int(value):
            return None
        return value if _within(value, schema) else None
    if kind == "boolean" and isinstance(value, bool):
        return value
    return None


def _mentioned_choice(choices: list[Any], text: str) -> Any:
    """The first enum value the text mentions as a word; else the first value."""
    for choice in choices:
        if isinstance(choice, str) and re.search(rf"\b{re.escape(choice)}\b", text, re.IGNORECASE):
            return choice
    return choices[0]


def _string_value(name: str, schema: dict[str, Any], seed: Seed) -> str:
    lowered = name.lower()
    fmt = schema.get("format")
    if fmt == "email" or "email" in lowered:
        found = _EMAIL.search(seed.conversation)
        return found.group(0) if found else _FORMAT_EXAMPLES["email"]
    if fmt in ("uri", "url") or lowered in ("url", "uri", "link"):
        found = _URL.search(seed.conversation)
        return found.group(0) if found else _FORMAT_EXAMPLES["uri"]
    if isinstance(fmt, str) and fmt in _FORMAT_EXAMPLES:
        return _FORMAT_EXAMPLES[fmt]
    if lowered.endswith("id"):
        found = _ID_TOKEN.search(seed.prompt) or _ID_TOKEN.search(seed.conversation)
        if found:
            return found.group(0)
        stem = re.sub(r"[_-]?id$", "", name, flags=re.IGNORECASE).lower() or "item"
        return f"{stem}_1"  # an id-looking value, not the prompt
    if any(word in lowered for word in _PLACE_NAMES):
        return _place(seed.prompt) or _place(seed.conversation) or _FALLBACK_PLACE
    if "currency" in lowered:
        found = _CURRENCY.search(seed.conversation)
        return found.group(0) if found else "USD"
    if lowered in ("item", "product", "thing"):
        found = _QUOTED.search(seed.prompt) or _THING_AFTER_VERB.search(seed.prompt)
        if found:
            return found.group(1).strip()
    return seed.prompt[:_STRING_SEED_CHARS] or "example"


def _place(text: str) -> str | None:
    found = _PLACE_AFTER.search(text) or _CAPITALISED.search(text)
    return found.group(1) if found else None


def _fit_length(value: str, schema: dict[str, Any]) -> str:
    longest = schema.get("maxLength")
    if isinstance(longest, int) and len(value) > longest:
        value = value[: max(longest, 0)]
    shortest = schema.get("minLength")
    if isinstance(shortest, int) and len(value) < shortest:
        value = value.ljust(shortest, "x")
    return value


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float | None, float | None]:
    step = 1 if integer else 0.01
    low = schema.get("minimum")
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        low = schema["exclusiveMinimum"] + step
    high = schema.get("maximum")
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        high = schema["exclusiveMaximum"] - step
    return (low if isinstance(low, int | float) else None, high if isinstance(high, int | float) else None)


def _within(value: float, schema: dict[str, Any]) -> bool:
    low, high = _bounds(schema, isinstance(value, int))
    return (low is None or value >= low) and (high is None or value <= high)


def _number_value(name: str, schema: dict[str, Any], seed: Seed, *, integer: bool) -> int | float:
    lowered = name.lower()
    if any(word in lowered for word in (*_AMOUNT_NAMES, "quantity", "count")):
        for match in _NUMBER.finditer(seed.prompt):
            number = float(match.group(0))
            if (not integer or number == int(number)) and _within(number, schema):
                return int(number) if integer else number
    low, high = _bounds(schema, integer)
    wanted = 25.0 if any(word in lowered for word in _AMOUNT_NAMES) else 3.0
    if low is not None and high is not None:
        wanted = low + (high - low) / 2 if not low <= wanted <= high else wanted
    elif low is not None:
        wanted = max(wanted, low)
    elif high is not None:
        wanted = min(wanted, high)
    step = schema.get("multipleOf")
    if isinstance(step, int | float) and step > 0:
        wanted = round(wanted / step) * step
    return int(wanted) if integer else float(wanted)


def _array_value(name: str, schema: dict[str, Any], seed: Seed) -> list[Any]:
    shortest = schema.get("minItems")
    count = shortest if isinstance(shortest, int) and shortest > 0 else 0
    singular = name[:-1] if name.endswith("s") else name
    return [synthesize_value(schema.get("items"), seed, singular) for _ in range(count)]
