"""Reading the UI's url-encoded form posts (bounded in size)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import PlainTextResponse, Response

from stevora.request_checks import form_fields
from stevora.ui import auth
from stevora.ui.auth import UiUser, current_user

MAX_FORM_BYTES = 1_000_000
CSRF_FAILED = "Invalid or missing CSRF token; reload the page and try again."


async def read_form(request: Request) -> dict[str, str]:
    """The last value of each field; an empty dict for a body over MAX_FORM_BYTES. Text that is not
    UTF-8 is a `ValidationError` (a 400), never U+FFFD in place of what was sent."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    return dict(form_fields(body))  # later fields win, as before


async def checked_form(request: Request) -> tuple[UiUser, dict[str, str]] | Response:
    """A state-changing POST's user and form, or the response refusing it: the login page for no
    user, 403 for a cross-site request or a missing or wrong CSRF token."""
    user = await current_user(request)
    if user is None:
        return auth.login_redirect(request)
    form = await read_form(request)
    if not auth.same_origin(request) or not auth.csrf_ok(user, form.get("csrf")):
        return PlainTextResponse(CSRF_FAILED, status_code=403)
    return user, form
