"""The response envelope and the base classes every API schema builds on.

Success: `{"success": true, "data": ...}`; paginated lists add
`"meta": {"page", "pageSize", "total", "totalPages"}`; every non-2xx answer is
`{"success": false, "error": {"code", "message", "details"}}`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    WrapSerializer,
)
from pydantic.alias_generators import to_camel
from pydantic_core import to_json
from starlette.responses import Response

T = TypeVar("T")


def wire_time(dt: datetime) -> str:
    """ISO 8601 with milliseconds and `Z`, e.g. `2026-04-02T12:00:00.000Z`. Same as
    `stevora.clock.iso`, but with a four-digit year before 1000 too (strftime drops the padding)."""
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


Timestamp = Annotated[
    datetime,
    PlainSerializer(wire_time, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time", "examples": ["2026-04-02T12:00:00.000Z"]}),
]
"""A timezone-aware datetime written as ISO 8601 with milliseconds and `Z`."""


UNREADABLE_KEY = "$unreadable"
UNREADABLE_MESSAGE = "This value is nested too deeply to be returned"


def _readable(value: Any, handler: SerializerFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except (ValueError, RecursionError):
        # Stored before the input limits (docs/security.md): nested deeper than JSON responses can
        # carry. The rest of the answer still goes out, so such a run can be read and cancelled.
        return {UNREADABLE_KEY: "This value is nested too deeply to be returned"}


def readable(value: Any) -> Any:
    """`value`, or the `{"$unreadable": ...}` marker when a response could not carry it (for
    answers built from plain dicts; schema fields use `Stored`)."""
    try:
        to_json(value)  # raises as the response's own serializer would
    except (ValueError, RecursionError):
        return {UNREADABLE_KEY: UNREADABLE_MESSAGE}
    return value


Stored = WrapSerializer(_readable, when_used="json")
"""Mark a stored JSON field: a value the serializer cannot write becomes `{"$unreadable": ...}`."""


class ApiOut(BaseModel):
    """Base of response schemas: built from snake_case rows, written as camelCase JSON."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        from_attributes=True,
        json_schema_serialization_defaults_required=True,
    )


class ApiIn(BaseModel):
    """Base of request bodies: camelCase only; unknown fields are errors (typos are reported)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=False, extra="forbid")


class Envelope(ApiOut, Generic[T]):
    success: Literal[True] = True
    data: T


class PageMeta(ApiOut):
    page: int
    page_size: int
    total: int
    total_pages: int


class Page(ApiOut, Generic[T]):
    success: Literal[True] = True
    data: list[T]
    meta: PageMeta


class ErrorBody(ApiOut):
    code: str = Field(examples=["NOT_FOUND"])
    message: str
    details: Any = Field(default_factory=dict)


class ErrorEnvelope(ApiOut):
    success: Literal[False] = False
    error: ErrorBody


def _json(model: BaseModel, status_code: int, headers: dict[str, str] | None = None) -> Response:
    body = model.model_dump_json(by_alias=True)
    return Response(body, status_code=status_code, media_type="application/json", headers=headers)


def ok(data: Any, status_code: int = 200) -> Response:
    """`{"success": true, "data": data}`; `data` is a schema object or a list of them."""
    return _json(Envelope[Any](data=data), status_code)


def page(data: list[Any], *, page: int, page_size: int, total: int) -> Response:
    total_pages = (total + page_size - 1) // page_size
    meta = PageMeta(page=page, page_size=page_size, total=total, total_pages=total_pages)
    return _json(Page[Any](data=data, meta=meta), 200)


def error_response(
    status_code: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> Response:
    body = ErrorBody(code=code, message=message, details=details if details is not None else {})
    return _json(ErrorEnvelope(error=body), status_code, headers)
