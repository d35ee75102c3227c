"""Hostile input refused at the edge, before any route (or FastAPI's JSON parser) sees it.

`EdgeLimits` reads the request body itself, counting bytes as they arrive: a declared
`Content-Length` over `STEVORA_MAX_REQUEST_BYTES` is refused before reading, and a chunked body is
refused as soon as it passes the limit (413 `PAYLOAD_TOO_LARGE`).

An API body (under `/v1/`) is then read exactly one way (docs/security.md, "One way to read a
body"): exactly one `Content-Type` header, `application/json` (a `charset` other than UTF-8 is
refused), text that is strict UTF-8 (no UTF-16, no CESU-encoded surrogates), parsed once by the
stdlib `json` module as FastAPI parses it. The parsed value is then checked as a whole by
`stevora.storable.problem_in_sent` (nesting, numbers,
Unicode, NUL: 400 naming the field). Per-field limits are checked where the field is known
(`stevora.engine.limits`).
"""

from __future__ import annotations

import json

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stevora.api.schemas.envelope import error_response
from stevora.settings import Settings
from stevora.storable import (
    INVALID_UNICODE,
    JSON_TOO_DEEP,
    Problem,
    problem_in_sent,
    top_level_key_at_depth,
)

_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})
API_PREFIX = "/v1/"
JSON_TYPE = "application/json"


class _TooLarge(Exception):
    pass


class EdgeLimits:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.max_bytes = settings.max_request_bytes
        self.max_depth = settings.max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        try:
            body = await self._read(receive)
        except _TooLarge:
            await self._too_large(scope, receive, send)
            return
        if body and scope["path"].startswith(API_PREFIX):
            refusal = self._refusal(scope["headers"], body)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what follows the body: http.disconnect

        await self.app(scope, replay, send)

    def _refusal(self, headers: list[tuple[bytes, bytes]], body: bytes) -> Response | None:
        refused = content_type_problem(headers)
        if refused is not None:
            return refused
        problem = body_problem(body, self.max_depth)
        if problem is None:
            return None
        return _problem(400, problem.code, problem.path, problem.message)

    async def _read(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nothing to serve
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"Request body is over the {self.max_bytes}-byte limit (STEVORA_MAX_REQUEST_BYTES)"
        response = error_response(
            413,
            "PAYLOAD_TOO_LARGE",
            message,
            {"errors": [{"path": "body", "message": message}], "limitBytes": self.max_bytes},
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


def _problem(status: int, code: str, path: str, message: str) -> Response:
    return error_response(
        status, code, f"{path}: {message}", {"errors": [{"path": path, "message": message}]}
    )


def content_type_problem(headers: list[tuple[bytes, bytes]]) -> Response | None:
    """The 400 / 415 for a body that does not say, once, that it is UTF-8 JSON; None when it does."""
    types = [value for name, value in headers if name.lower() == b"content-type"]
    if len(types) > 1:
        return _problem(400, "VALIDATION_ERROR", "content-type", "send exactly one Content-Type header")
    if not types:
        return _problem(415, "UNSUPPORTED_MEDIA_TYPE", "content-type", f"required: {JSON_TYPE}")
    media_type, *params = (part.strip() for part in types[0].decode("latin-1").split(";"))
    if media_type.lower() != JSON_TYPE:
        return _problem(
            415, "UNSUPPORTED_MEDIA_TYPE", "content-type", f"must be {JSON_TYPE}, got '{media_type[:100]}'"
        )
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return _problem(
                415, "UNSUPPORTED_MEDIA_TYPE", "content-type", "the only charset accepted is utf-8"
            )
    return None


def body_problem(body: bytes, max_depth: int) -> Problem | None:
    """What in a JSON body cannot be stored (or why it is not JSON), found after parsing it."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Problem(INVALID_UNICODE, "body", f"not valid UTF-8 (byte {exc.start}); send UTF-8 JSON")
    try:
        value = json.loads(text)
    except RecursionError:
        where = top_level_key_at_depth(body, max_depth)
        return Problem(JSON_TOO_DEEP, where, f"Nested deeper than {max_depth} levels")
    except ValueError:
        # Refused here, not left to the route: the route's parser (`json.loads` of the bytes) would
        # guess another encoding or skip a BOM and read what this check never saw.
        return Problem("VALIDATION_ERROR", "body", "Request body is not valid JSON")
    return problem_in_sent(value, max_depth=max_depth)
