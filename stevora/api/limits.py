"""Hostile input refused at the edge, before any route (or FastAPI's JSON parser) sees it.

`EdgeLimits` reads the request body itself, counting bytes as they arrive: a declared
`Content-Length` over `STEVORA_MAX_REQUEST_BYTES` is refused before reading, and a chunked body is
refused as soon as it passes the limit (413 `PAYLOAD_TOO_LARGE`). A JSON body is then checked by
`stevora.storable.problem_in_body` (nesting, numbers, Unicode: 400 naming the field) and handed
on to the app unchanged. The per-field limits (definition, run input, signal payload, state) are
checked where the field is known (`stevora.engine.limits`, the definitions router).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stevora.api.schemas.envelope import error_response
from stevora.settings import Settings
from stevora.storable import problem_in_body

_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        try:
            body = await self._read(receive)
        except _TooLarge:
            await self._too_large(scope, receive, send)
            return
        if body and _is_json(headers.get(b"content-type")):
            problem = problem_in_body(body, max_depth=self.max_depth)
            if problem is not None:
                response = error_response(
                    400,
                    problem.code,
                    f"{problem.path}: {problem.message}",
                    {"errors": [{"path": problem.path, "message": problem.message}]},
                )
                await response(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what follows the body: http.disconnect

        await self.app(scope, replay, send)

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


def _is_json(content_type: bytes | None) -> bool:
    # FastAPI parses a body without a content type as JSON too.
    return content_type is None or b"json" in content_type.lower()
