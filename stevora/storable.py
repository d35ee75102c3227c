"""What JSON a run can store and read back exactly: the checks behind the documented input limits.

Every JSON value Stevora keeps (run input, state, signal payloads, tool outputs, definitions) goes
through PostgreSQL jsonb, asyncpg with orjson, the stdlib json module in the API and pydantic in
responses. A value is *storable* when every one of them reads it back unchanged:

* numbers: integers in the signed 64-bit range (orjson turns larger ones into floats, so a worker
  would see `1.2345678901234568e+29` where the API shows the exact value) and finite floats (jsonb
  has no NaN or Infinity: orjson wrote them as `null`);
* strings and keys: valid Unicode (a lone surrogate such as `\\ud800` cannot be encoded as UTF-8);
* nesting: at most `max_depth` containers deep (orjson stops at 255, pydantic's serializer at 255;
  the limit leaves room for the envelopes, events and webhooks a value is wrapped in).

`problem_in_value` checks a Python value; `problem_in_body` checks request bytes cheaply (a scan for
what could be a problem, a parse only when something could be). docs/security.md lists the limits.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MIN_INT = -(2**63)
MAX_INT = 2**63 - 1

# Problem codes (the API's error codes; also the `error_code` of a refused tool output).
INVALID_NUMBER = "INVALID_NUMBER"
JSON_TOO_DEEP = "JSON_TOO_DEEP"
INVALID_UNICODE = "INVALID_UNICODE"

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
# In request bytes: what could be a number beyond 64 bits or a double's range (NaN and Infinity
# are looked for as plain substrings). A body without any of these, and not nested too deep,
# needs no parse. Separate scans: one alternation regex measured three times slower.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_BIG_EXPONENT = re.compile(rb"[eE][+-]?[0-9]{3}")


def _suspect(body: bytes) -> bool:
    return (
        b"NaN" in body
        or b"Infinity" in body
        or _LONG_DIGITS.search(body) is not None
        or _BIG_EXPONENT.search(body) is not None
        or (b"\\u" in body and _SURROGATE_ESCAPE.search(body) is not None)
    )


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a value cannot be stored: a code, the JS-like path of the offending part, a message."""

    code: str
    path: str
    message: str


class _Unreadable:
    """A number the parser met that does not round-trip (kept to report where it was)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _int(text: str) -> int | _Unreadable:
    # Checked by length first: int() of thousands of digits is slow (and refused past 4300).
    if len(text) > 20:
        return _Unreadable(text)
    value = int(text)
    return value if MIN_INT <= value <= MAX_INT else _Unreadable(text)


def _float(text: str) -> float | _Unreadable:
    value = float(text)
    return value if math.isfinite(value) else _Unreadable(text)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _number_text(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}...{text[-4:]} ({len(text)} characters)"


def _bad_string(value: str) -> bool:
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def problem_in_value(value: Any, *, max_depth: int, root: str = "") -> Problem | None:
    """The first part of `value` that cannot be stored exactly, or None.

    `root` names the field `value` came in (`input`, `payload`, ...) and prefixes the path. The
    stdlib's C encoder rules the common case out (NaN and Infinity raise, depth and big integers
    show in the text); the value is walked in Python only to say where a problem is."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        return _walk(value, max_depth, root)
    return problem_in_dumped(value, text, max_depth=max_depth, root=root)


def _walk(value: Any, max_depth: int, root: str) -> Problem | None:
    # Iterative: a value nested deeper than Python's recursion limit must not crash the check.
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            if depth > max_depth:
                return Problem(JSON_TOO_DEEP, path or "body", f"Nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key in item:
                    if isinstance(key, str) and _bad_string(key):
                        return Problem(INVALID_UNICODE, path or "body", "A key is not valid Unicode")
                # Pushed in reverse so the first problem in document order is the one reported.
                stack.extend((item[k], _join(path, str(k)), depth) for k in reversed(list(item)))
            else:
                stack.extend((item[i], _join(path, i), depth) for i in range(len(item) - 1, -1, -1))
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not MIN_INT <= item <= MAX_INT:
                text = _number_text(str(item)) if abs(item).bit_length() < 14_000 else "an integer"
                return Problem(INVALID_NUMBER, path or "body", _int_message(text))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return Problem(INVALID_NUMBER, path or "body", f"{item} is not a JSON number")
        elif isinstance(item, _Unreadable):
            text = _number_text(item.text)
            if item.text in ("NaN", "Infinity", "-Infinity"):
                return Problem(INVALID_NUMBER, path or "body", f"{item.text} is not a JSON number")
            if any(c in item.text for c in ".eE"):
                return Problem(INVALID_NUMBER, path or "body", f"{text} is beyond the range of a double")
            return Problem(INVALID_NUMBER, path or "body", _int_message(text))
        elif isinstance(item, str) and _bad_string(item):
            return Problem(
                INVALID_UNICODE, path or "body", "Not valid Unicode (a lone surrogate such as \\ud800)"
            )
    return None


def _int_message(text: str) -> str:
    return f"{text} is outside the integers stored exactly (-2^63 to 2^63-1); send it as a string"


def _top_level_key_at_depth(body: bytes, max_depth: int) -> str:
    """For a body too deep to parse: the top-level key under which the nesting passes the limit."""
    depth = 0
    key = ""
    in_string = escaped = False
    start = 0
    last_string = ""
    for i, byte in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
                last_string = body[start:i].decode("utf-8", "replace")
        elif byte == 0x22:
            in_string, start = True, i + 1
        elif byte == 0x3A and depth == 1:  # ':' at the top level: the string before was a key
            key = last_string
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > max_depth:
                return _join("", key) if key else "body"
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return "body"


# JSON strings (to blank out before counting brackets), and a container holding no other.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_INNERMOST = re.compile(rb"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _depth_exceeds(text: bytes, max_depth: int) -> bool:
    """Whether JSON text nests deeper than `max_depth`, without parsing it: strings blanked out,
    then one regex pass per level takes away the innermost containers (C speed, wide or not)."""
    if text.count(b"[") + text.count(b"{") <= max_depth:
        return False
    text = _STRING.sub(b'""', text)
    for _ in range(max_depth):
        text = _INNERMOST.sub(b"0", text)
        if b"[" not in text and b"{" not in text:
            return False
    return True


def problem_in_body(body: bytes, *, max_depth: int) -> Problem | None:
    """Check a JSON request body; None when it is fine *or not JSON at all* (the route's own
    validation reports that). Paths are the body's field paths (`input.a[0]`).

    A body with nothing suspect (no 19-digit run, `NaN`, `Infinity`, 3-digit exponent or escaped
    surrogate, and not too deep) is not parsed; one that is gets parsed, and walked only when the
    parse met an unreadable number, the nesting is too deep or a surrogate escape is lone."""
    deep = _depth_exceeds(body, max_depth)
    if not deep and not _suspect(body):
        return None
    unreadable: list[_Unreadable] = []

    def flag(value: Any) -> Any:
        if isinstance(value, _Unreadable):
            unreadable.append(value)
        return value

    try:
        value = json.loads(
            body,
            parse_int=lambda t: flag(_int(t)),
            parse_float=lambda t: flag(_float(t)),
            parse_constant=lambda t: flag(_Unreadable(t)),
        )
    except RecursionError:
        return Problem(
            JSON_TOO_DEEP, _top_level_key_at_depth(body, max_depth), f"Nested deeper than {max_depth} levels"
        )
    except ValueError:  # not JSON (or not UTF-8): left to the route
        return None
    if deep or unreadable:
        return _walk(value, max_depth, "")
    if _SURROGATE_ESCAPE.search(body) and _bad_string(json.dumps(value, ensure_ascii=False)):
        return _walk(value, max_depth, "")
    return None


_SUSPECT_TEXT = re.compile(r"[0-9]{19}")


def problem_in_dumped(value: Any, text: str, *, max_depth: int, root: str = "") -> Problem | None:
    """`problem_in_value` for a value whose JSON text (`json.dumps`, NaN refused) is at hand:
    the text rules the common case out cheaply; the value is walked only when it cannot."""
    if _SUSPECT_TEXT.search(text) or _bad_string(text):
        return _walk(value, max_depth, root)
    if text.count("[") + text.count("{") > max_depth and _depth_exceeds(text.encode(), max_depth):
        return _walk(value, max_depth, root)
    return None


def encoded_size(value: Any) -> int:
    """Bytes of `value`'s JSON text as stored (UTF-8, no spaces)."""
    try:
        import orjson  # a server dependency; the client-only install measures with the stdlib
    except ImportError:  # pragma: no cover - the test environment has the server extras
        pass
    else:
        try:
            return len(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))
        except (orjson.JSONEncodeError, TypeError):
            pass  # what orjson refuses (integers beyond 64 bits, ...) the stdlib still writes
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return len(text.encode("utf-8", "replace"))
