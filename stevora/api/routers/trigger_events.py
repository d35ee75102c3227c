"""`/v1/events`: events that start runs of the definitions whose `triggers` match them, and
resume runs waiting for them (docs/triggers.md, docs/api/events.md).

Not `/v1/workflow-runs/{id}/events` (a run's timeline, `routers/events.py`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx, Paging
from stevora.api.errors import validation_problems
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Envelope, Page, ok, page
from stevora.api.schemas.trigger_events import EventIn, EventOut, EventRun
from stevora.db import trigger_events as rows
from stevora.engine import limits
from stevora.errors import ValidationError
from stevora.triggers.events import IncomingEvent, Received, receive

router = APIRouter(prefix="/events", tags=["triggers"])
_ONE = TypeAdapter(EventIn)
_MANY = TypeAdapter(list[EventIn])


def _out(event: Any, runs: list[Any], deduplicated: bool = False) -> EventOut:
    return EventOut.model_validate(
        {
            **dict(event),
            "id": event["event_key"],
            "deduplicated": deduplicated,
            "runs": [EventRun.model_validate(dict(r)) for r in runs],
        }
    )


def event_answer(received: Received) -> EventOut:
    return _out(received.event, received.runs, received.deduplicated)


def _parse(body: Any, max_batch: int) -> tuple[list[EventIn], bool]:
    batch = isinstance(body, list)
    try:
        parsed = _MANY.validate_python(body) if batch else [_ONE.validate_python(body)]
    except PydanticValidationError as exc:
        raise ValidationError.from_problems(validation_problems(exc.errors())) from None
    if batch and not 1 <= len(parsed) <= max_batch:
        raise ValidationError.from_problems(
            [{"path": "body", "message": f"a batch holds 1 to {max_batch} events (STEVORA_MAX_EVENT_BATCH)"}]
        )
    return parsed, batch


@router.post(
    "",
    status_code=201,
    response_model=Envelope[EventOut] | Envelope[list[EventOut]],
    responses=errors(400),
    summary="Send an event (or a list of them)",
)
async def send_events(auth: Auth, ctx: Ctx, body: Annotated[dict[str, Any] | list[Any], Body()]) -> Response:
    """201 with the runs it started; a repeated `id` is a 200 naming the runs the first one started.
    A JSON array is the batch form: 200 with one answer per event, in order."""
    parsed, batch = _parse(body, ctx.settings.max_event_batch)
    for index, event in enumerate(parsed):
        where = f"[{index}].data" if batch else "data"
        limits.check_sized(
            ctx.settings,
            event.data,
            where,
            ctx.settings.max_signal_payload_bytes,
            "STEVORA_MAX_SIGNAL_PAYLOAD_BYTES",
        )
    received = await receive(
        ctx.rt, auth.workspace_id, [IncomingEvent(e.name, e.data, e.id, e.ts) for e in parsed]
    )
    answers = [event_answer(r) for r in received]
    if batch:
        return ok(answers)
    return ok(answers[0], 200 if received[0].deduplicated else 201)


@router.get("", response_model=Page[EventOut], summary="List events and the runs each started")
async def list_events(
    auth: Auth,
    ctx: Ctx,
    paging: Paging,
    name: Annotated[str | None, Query(max_length=200, description="Only events of this name.")] = None,
) -> Response:
    """Newest first."""
    found, total = await rows.list_events(
        ctx.rt.pool, auth.workspace_id, name, paging.offset, paging.page_size
    )
    runs = await rows.runs_of_events(ctx.rt.pool, [r["id"] for r in found])
    data = [_out(r, runs.get(r["id"], [])) for r in found]
    return page(data, page=paging.page, page_size=paging.page_size, total=total)
