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

`problem_in_value` checks a Python value: a request body is checked after it is parsed, never by
scanning its bytes (another encoding would slip past a scan; docs/security.md, "One way to read a
body"). docs/security.md lists the limits.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MIN_INT = -(2**63)
MAX_INT = 2**63 - 1

NUL_MESSAGE = "NUL characters are not allowed"

# Problem codes (the API's error codes; also the `error_code` of a refused tool output).
INVALID_NUMBER = "INVALID_NUMBER"
JSON_TOO_DEEP = "JSON_TOO_DEEP"
INVALID_UNICODE = "INVALID_UNICODE"

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a value cannot be stored: a code, the JS-like path of the offending part, a message."""

    code: str
    path: str
    message: str


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


def problem_in_sent(value: Any, *, max_depth: int, root: str = "") -> Problem | None:
    """`problem_in_value`, and a NUL anywhere (`VALIDATION_ERROR`): the check of a value a client
    sends (a request body, a form's JSON), which jsonb would otherwise store with U+FFFD for NUL.
    One JSON encoding serves both checks; the value is walked only to name a problem's path."""
    text: str | None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        text = None
    problem = (
        _walk(value, max_depth, root)
        if text is None
        else problem_in_dumped(value, text, max_depth=max_depth, root=root)
    )
    if problem is not None:
        return problem
    # The encoder writes a NUL as `\u0000` (an escaped backslash before `u0000` also matches:
    # the walk then finds none).
    if text is None or "\\u0000" in text:
        nul = find_nul(value, root)
        if nul is not None:
            return Problem("VALIDATION_ERROR", nul or "body", NUL_MESSAGE)
    return None


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
        elif isinstance(item, str) and _bad_string(item):
            return Problem(
                INVALID_UNICODE, path or "body", "Not valid Unicode (a lone surrogate such as \\ud800)"
            )
    return None


def _int_message(text: str) -> str:
    return f"{text} is outside the integers stored exactly (-2^63 to 2^63-1); send it as a string"


def top_level_key_at_depth(body: bytes, max_depth: int) -> str:
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


_SUSPECT_TEXT = re.compile(r"[0-9]{19}")


def problem_in_dumped(value: Any, text: str, *, max_depth: int, root: str = "") -> Problem | None:
    """`problem_in_value` for a value whose JSON text (`json.dumps`, NaN refused) is at hand:
    the text rules the common case out cheaply; the value is walked only when it cannot."""
    if _SUSPECT_TEXT.search(text) or _bad_string(text):
        return _walk(value, max_depth, root)
    if text.count("[") + text.count("{") > max_depth and _depth_exceeds(text.encode(), max_depth):
        return _walk(value, max_depth, root)
    return None


def find_nul(value: Any, path: str = "") -> str | None:
    """The path of the first string (or key) in `value` holding a NUL (PostgreSQL text and jsonb
    cannot hold U+0000), or None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:  # iterative: a value nested deeper than the recursion limit must not crash it
        item, where = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where
        elif isinstance(item, dict):
            for key in reversed(list(item)):
                if isinstance(key, str) and "\x00" in key:
                    return f"{where}.{key!r}" if where else repr(key)
                stack.append((item[key], f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((item[i], f"{where}[{i}]") for i in range(len(item) - 1, -1, -1))
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
