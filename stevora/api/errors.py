"""Every failure leaves the API as the error envelope.

* `StevoraError` → its own status, code, message and details (5xx messages are replaced, since
  they may carry internals).
* FastAPI's request validation → 400 `VALIDATION_ERROR` with `details.errors = [{path, message}]`,
  paths JS-like and camelCase (`steps[0].name`, `pageSize`).
* Starlette's HTTP errors (unknown route, wrong method) → their status with `NOT_FOUND` /
  `METHOD_NOT_ALLOWED`.
* The database unreachable, restarting or dropping the connection → 503 `SERVICE_UNAVAILABLE`
  with `Retry-After` (the request may succeed when retried; the pools replace dead connections).
* Anything else → 500 `INTERNAL_ERROR` "Internal server error", logged with its traceback.
"""

from __future__ import annotations

import functools
import json
import math
import re
import traceback
from collections.abc import Sequence
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stevora.api.schemas.envelope import error_response
from stevora.db.transient import is_connection_error
from stevora.errors import RateLimitError, StevoraError, ValidationError

log = structlog.get_logger("stevora.api")

INTERNAL_MESSAGE = "Internal server error"
UNAVAILABLE_MESSAGE = "The database is unavailable; retry shortly"
RETRY_AFTER_S = 1
_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})
_HTTP_METHODS = {"GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH", "TRACE"}
_HTTP_CODES = {
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}


def format_loc(loc: Sequence[Any]) -> str:
    """`("body", "steps", 0, "name")` → `steps[0].name`; `("query", "pageSize")` → `pageSize`."""
    parts = list(loc)
    if parts and parts[0] in _LOCATIONS:
        where = parts.pop(0)
        if not parts or (where == "body" and all(isinstance(p, int) for p in parts)):
            return str(where)  # the body as a whole (missing, not JSON, ...)
    path = ""
    for item in parts:
        if isinstance(item, int):
            path += f"[{item}]"
        elif _IDENTIFIER.fullmatch(str(item)):
            path += f".{item}" if path else str(item)
        else:
            path += f"[{json.dumps(str(item))}]"
    return path


def validation_problems(errors: Sequence[Any]) -> list[dict[str, str]]:
    problems = []
    for err in errors:
        message = str(err.get("msg", "Invalid value"))
        if err.get("type") == "json_invalid":
            message = "Request body is not valid JSON"
        problems.append({"path": format_loc(err.get("loc", ())), "message": message})
    return problems


async def _stevora_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StevoraError)
    if exc.http_status >= 500 and exc.code != "SERVICE_UNAVAILABLE":
        log.error("request_failed", path=request.url.path, code=exc.code, error=exc.message)
        return error_response(exc.http_status, "INTERNAL_ERROR", INTERNAL_MESSAGE)
    headers = None
    if isinstance(exc, RateLimitError):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    elif exc.http_status == 503:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    return error_response(exc.http_status, exc.code, exc.message, exc.details, headers)


async def _request_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    err = ValidationError.from_problems(validation_problems(exc.errors()))
    return error_response(err.http_status, err.code, err.message, err.details)


@functools.lru_cache(maxsize=256)
def _path_pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


def _allowed_methods(request: Request, given: str | None) -> str | None:
    """Every method served at this path. Starlette's 405 names only the methods of the first route
    that matched the path, so `GET` + `POST /v1/webhooks` (two routes) answered `Allow: POST`; the
    documented operations of every path template that matches are added."""
    methods = {m.strip().upper() for m in (given or "").split(",") if m.strip()}
    for template, item in request.app.openapi().get("paths", {}).items():
        if _path_pattern(template).fullmatch(request.url.path):
            methods |= {m.upper() for m in item if m.upper() in _HTTP_METHODS}
    return ", ".join(sorted(methods)) if methods else None


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "HTTP_ERROR" if exc.status_code < 500 else "INTERNAL_ERROR")
    message = "Route not found" if exc.status_code == 404 else str(exc.detail)
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 405:
        allowed = _allowed_methods(request, (headers or {}).get("Allow"))
        if allowed:
            headers = {**(headers or {}), "Allow": allowed}
    return error_response(exc.status_code, code, message, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StevoraError, _stevora_error)
    app.add_exception_handler(RequestValidationError, _request_validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(CatchAllMiddleware)


class CatchAllMiddleware:
    """Turns an unexpected exception into the 500 envelope (if nothing was sent yet) and logs it.

    Starlette's own `Exception` handler re-raises after answering, which makes servers log the
    error twice and test transports raise; this middleware ends the story here instead.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if is_connection_error(exc):
                log.warning(
                    "database_unavailable",
                    method=scope.get("method"),
                    path=scope.get("path"),
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
                if started:
                    raise
                unavailable = error_response(
                    503,
                    "SERVICE_UNAVAILABLE",
                    UNAVAILABLE_MESSAGE,
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
                await unavailable(scope, receive, send)
                return
            # A plain traceback, not exc_info: rich console tracebacks print locals, and the
            # locals here include request headers (API keys).
            log.error(
                "unhandled_error",
                method=scope.get("method"),
                path=scope.get("path"),
                exception=traceback.format_exc(),
            )
            if started:
                raise
            response = error_response(500, "INTERNAL_ERROR", INTERNAL_MESSAGE)
            await response(scope, receive, send)
