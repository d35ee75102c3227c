"""Checks every way in shares (the API's routes and the web UI's): what PostgreSQL cannot take.

PostgreSQL text cannot hold U+0000, so a NUL in a path, a query parameter or a form field is a 400
naming where it was, never a driver error. JSON bodies are checked once, after parsing, by the
API's edge (`stevora.api.limits`); the values a form carries as JSON text go through the same
`stevora.engine.limits.check_value` as the API's fields. docs/security.md states the rule.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from fastapi import Request

from stevora.errors import ValidationError
from stevora.storable import NUL_MESSAGE

FORM_TYPE = "application/x-www-form-urlencoded"


def form_fields(body: bytes) -> list[tuple[str, str]]:
    """A url-encoded form's fields, decoded strictly: bytes (raw or %-escaped) that are not UTF-8
    are a 400 naming the form, not U+FFFD stored in their place."""
    try:
        return parse_qsl(body.decode("utf-8"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise ValidationError.at("form", "The form is not valid UTF-8") from None


async def reject_nul(request: Request) -> None:
    """A dependency of every API and UI route: 400 for a NUL in the path, a query parameter or a
    url-encoded form field (JSON bodies: the API's edge, after parsing)."""
    problems: list[dict[str, str]] = []
    if "\x00" in request.url.path or "%00" in request.url.path:
        problems.append({"path": "path", "message": NUL_MESSAGE})
    for name, value in request.query_params.multi_items():
        if "\x00" in name or "\x00" in value:
            problems.append({"path": name.replace("\x00", "") or "query", "message": NUL_MESSAGE})
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if request.method in ("POST", "PUT", "PATCH") and content_type == FORM_TYPE:
        for name, value in form_fields(await request.body()):
            if "\x00" in name or "\x00" in value:
                problems.append({"path": name.replace("\x00", "") or "form", "message": NUL_MESSAGE})
    if problems:
        raise ValidationError.from_problems(problems)
