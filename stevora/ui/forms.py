"""Reading the UI's url-encoded form posts (bounded in size)."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import Request

MAX_FORM_BYTES = 1_000_000
CSRF_FAILED = "Invalid or missing CSRF token; reload the page and try again."


async def read_form(request: Request) -> dict[str, str]:
    """The last value of each field; an empty dict for a body over MAX_FORM_BYTES."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in parsed.items()}
