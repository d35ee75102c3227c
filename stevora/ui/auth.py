"""Who is looking at the UI: the API key in the `stevora_key` cookie, and CSRF tokens for forms.

The cookie holds the raw key (HttpOnly, SameSite=Strict, Secure behind HTTPS), so the UI sees
exactly what an API client with that key sees: one workspace. Every request re-checks the key
against `api_keys` (SHA-256 hex, not revoked), so revoking a key logs its UI sessions out.

CSRF: each form carries `HMAC-SHA256(raw key, "stevora-ui-csrf-v1")`. A cross-site page cannot
read the cookie, so it cannot compute the token; SameSite=Strict and an Origin check are extra
layers on top.

Limits: the same as the API's, with the same state (the API app's `ApiContext`): a key that is not
live counts as a failed attempt of the client's address (stevora/throttle/failed_auth.py), and each
signed-in request takes a token from the workspace's bucket (stevora/throttle/workspace_requests.py). Either
limit reached: 429 with Retry-After (`UiRoute`; the login form says it on the page).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from fastapi import Request
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from stevora.db.reads import keys as key_reads
from stevora.errors import RateLimitError, StevoraError, ValidationError

if TYPE_CHECKING:
    from stevora.runtime import Runtime
    from stevora.throttle.failed_auth import FailedAuthLimiter
    from stevora.throttle.workspace_requests import RateLimiter

COOKIE_NAME = "stevora_key"
FLASH_COOKIE = "stevora_flash"
COOKIE_PATH = "/ui"
_CSRF_CONTEXT = b"stevora-ui-csrf-v1"
_MAX_KEY_CHARS = 200


@dataclass(frozen=True, slots=True)
class UiUser:
    workspace_id: str
    workspace_name: str
    key_id: str
    key_name: str
    key_prefix: str
    csrf_token: str

    @property
    def actor(self) -> str:
        """Who decided, as recorded in `decidedBy`: the signed-in key's name and id."""
        return f"{self.key_name} ({self.key_id}) via UI"[:200]


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def csrf_token_for(raw_key: str) -> str:
    return hmac.new(raw_key.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def runtime_of(request: Request) -> Runtime:
    """`app.state.runtime`, or the API app's `app.state.ctx.runtime` (started by its lifespan)."""
    state = request.app.state
    rt = getattr(state, "runtime", None) or getattr(getattr(state, "ctx", None), "runtime", None)
    if rt is None:
        raise StevoraError("Runtime is not started", http_status=503, code="SERVICE_UNAVAILABLE")
    return rt  # type: ignore[no-any-return]


async def user_for_key(rt: Runtime, raw_key: str | None) -> UiUser | None:
    """The UI user of a raw key, or `None` when it is missing, unknown or revoked."""
    if not raw_key or len(raw_key) > _MAX_KEY_CHARS:
        return None
    key = await key_reads.by_hash(rt.pool, hash_key(raw_key))
    if key is None or key.revoked_at is not None:
        return None
    return UiUser(
        workspace_id=key.workspace_id,
        workspace_name=key.workspace_name,
        key_id=key.id,
        key_name=key.name,
        key_prefix=key.key_prefix,
        csrf_token=csrf_token_for(raw_key),
    )


async def current_user(request: Request) -> UiUser | None:
    raw_key = request.cookies.get(COOKIE_NAME)
    user = await authenticate(request, raw_key)
    if raw_key and user is None:
        # A revoked key's open tab would otherwise spend its address's failed attempts on every
        # refresh, and then be refused the login page too: `UiRoute` drops the cookie.
        request.state.stale_key_cookie = True
    return user


async def authenticate(request: Request, raw_key: str | None) -> UiUser | None:
    """The user of `raw_key` (`None`: no key, or not a live one), after the client address's limit
    on failed attempts and then the workspace's rate limit: `RateLimitError` when either is reached."""
    if not raw_key:
        return None
    failures, limiter = _limits(request)
    address = request.client.host if request.client is not None else "unknown"
    failures.check(address)
    failures.take(address)  # before the lookup, so concurrent guesses cannot all pass the check
    rt = runtime_of(request)
    user = await user_for_key(rt, raw_key)
    if user is None:
        return None
    failures.give_back(address)
    await limiter.hit(rt, user.workspace_id)
    return user


def _limits(request: Request) -> tuple[FailedAuthLimiter, RateLimiter]:
    """The API app's limiters (one state for API and UI); a UI-only app (tests) gets its own."""
    state = request.app.state
    ctx = getattr(state, "ctx", None)
    if ctx is not None:
        return ctx.keys.failures, ctx.limiter
    limits: tuple[FailedAuthLimiter, RateLimiter] | None = getattr(state, "ui_limits", None)
    if limits is None:
        # Imported here: stevora.api imports this module (its app mounts the UI).
        from stevora.throttle.failed_auth import FailedAuthLimiter
        from stevora.throttle.workspace_requests import RateLimiter

        settings = runtime_of(request).settings
        limits = (
            FailedAuthLimiter(settings.auth_failures_per_minute),
            RateLimiter(settings.rate_limit_per_minute),
        )
        state.ui_limits = limits
    return limits


def retry_after(exc: RateLimitError) -> str:
    return str(max(1, math.ceil(exc.retry_after_s)))


def throttled(exc: RateLimitError) -> Response:
    seconds = retry_after(exc)
    return PlainTextResponse(
        f"{exc.message}; try again in {seconds} s.", status_code=429, headers={"Retry-After": seconds}
    )


class UiRoute(APIRoute):
    """A UI route whose `RateLimitError` (from `current_user`) is a plain-text 429 with Retry-After,
    and whose answer to a cookie holding a key that is not live also clears that cookie."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def limited(request: Request) -> Response:
            try:
                response = await handler(request)
            except RateLimitError as exc:
                return throttled(exc)
            except ValidationError as exc:  # what the shared request checks refuse (a NUL, ...)
                return refused(exc)
            if getattr(request.state, "stale_key_cookie", False):
                clear_key_cookie(response)
            return response

        return limited


def refused(exc: ValidationError) -> Response:
    """A 400 naming each refused field, as plain text (the API's checks, the UI's words)."""
    problems = (exc.details or {}).get("errors") or []
    lines = [f"{p.get('path')}: {p.get('message')}" for p in problems] or [exc.message]
    return PlainTextResponse("Refused: " + "; ".join(lines) + "\n", status_code=400)


def safe_next(target: str | None) -> str:
    """Only same-site UI paths may be redirect targets after login (no open redirects)."""
    if target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui/runs"


def login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/ui/login?next={quote(target, safe='')}", status_code=303)


def _is_https(request: Request) -> bool:
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return proto.split(",")[0].strip() == "https"


def set_key_cookie(request: Request, response: Response, raw_key: str) -> None:
    # A session cookie: the key is not written to disk by the browser beyond the session.
    response.set_cookie(
        COOKIE_NAME,
        raw_key,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=_is_https(request),
    )


def clear_key_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE_NAME, path=COOKIE_PATH, httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """Browsers send Origin on POST; when present it must name this host."""
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", request.url.netloc)


def csrf_ok(user: UiUser, submitted: str | None) -> bool:
    return submitted is not None and hmac.compare_digest(user.csrf_token, submitted)


def set_flash(response: Response, message: str, kind: str = "ok", link: str | None = None) -> None:
    """A one-time message for the page the POST redirects to (a 60 s HttpOnly cookie)."""
    value = quote(json.dumps({"kind": kind, "text": message, "link": link}))
    response.set_cookie(FLASH_COOKIE, value, path=COOKIE_PATH, max_age=60, httponly=True, samesite="strict")


@dataclass(frozen=True, slots=True)
class Flash:
    kind: str
    text: str
    link: str | None


def read_flash(request: Request) -> Flash | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        data = json.loads(unquote(raw))
        kind, text, link = str(data["kind"]), str(data["text"]), data.get("link")
    except (ValueError, KeyError, TypeError):
        return None
    return Flash(
        kind=kind if kind in ("ok", "error") else "ok",
        text=text,
        link=safe_next(link) if isinstance(link, str) else None,
    )


def clear_flash(response: Response) -> None:
    response.delete_cookie(FLASH_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
