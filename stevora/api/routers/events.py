"""`/v1/workflow-runs/{id}/events` (pages, oldest first) and `/events/stream` (Server-Sent Events).

Paging does not use OFFSET: sequences are gap-free 1..N per run, so page p is the sequence range
((p-1)*pageSize, p*pageSize], read straight off the (workflow_run_id, sequence) unique index —
the last page of a 100,000-event run costs the same as the first. `total` is the run's
`event_seq` counter, which is incremented in the transaction that writes the events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query
from starlette.responses import Response, StreamingResponse

from stevora.api.deps import ApiContext, Auth, Ctx, Paging
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Page, page
from stevora.api.schemas.runs import EventOut
from stevora.db.reads import events as event_reads
from stevora.db.reads import runs as run_reads
from stevora.errors import NotFoundError, ValidationError
from stevora.live import delta_sse, deltas_for, drain
from stevora.runtime import Runtime

router = APIRouter(prefix="/workflow-runs", tags=["events"])
RunId = Annotated[str, Path(description="A workflow run id (wfrun_...).")]
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
_BATCH = 500
MAX_SEQUENCE = 2**31 - 1  # workflow_events.sequence is an integer column


async def _run_progress(rt: Runtime, workspace_id: str, run_id: str) -> tuple[str, int]:
    """(status, last event sequence) of the caller's run, or NotFoundError."""
    found = await run_reads.progress(rt.pool, workspace_id, run_id)
    if found is None:
        raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
    return found


async def events_between(rt: Runtime, run_id: str, after: int, until: int) -> list[EventOut]:
    """Events with `after < sequence <= until`, in order."""
    return [EventOut.model_validate(r) for r in await event_reads.after(rt.pool, run_id, after, until=until)]


@router.get(
    "/{run_id}/events", response_model=Page[EventOut], responses=errors(404), summary="A run's events"
)
async def list_events(run_id: RunId, auth: Auth, ctx: Ctx, paging: Paging) -> Response:
    _, total = await _run_progress(ctx.rt, auth.workspace_id, run_id)
    data: list[EventOut] = []
    if paging.offset < total:
        data = await events_between(
            ctx.rt, run_id, paging.offset, min(total, paging.offset + paging.page_size)
        )
    return page(data, page=paging.page, page_size=paging.page_size, total=total)


# The schema of each server-sent message (OpenAPI describes a `text/event-stream` body message by
# message, as the object of its fields); `: keep-alive` comments carry no message.
SSE_MESSAGE = {
    "type": "object",
    "properties": {
        "id": {
            "type": "string",
            "pattern": "^[0-9]+$",
            "description": "The event's `sequence`; absent on `llm.text.delta`.",
        },
        "event": {"type": "string", "description": "The event's `eventType`, or `llm.text.delta`."},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The `Event` as JSON, or the delta's `{runId, stepRunId, round, model, provider, text, offset}`.",
        },
    },
    "required": ["event", "data"],
}


@router.get(
    "/{run_id}/events/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "`text/event-stream` of `id: <sequence>`, `event: <eventType>`, `data: <Event>`; "
            "and, id-less and ephemeral, `event: llm.text.delta` with `data: {runId, stepRunId, round, model, "
            "provider, text, offset}` while a streamed model call answers",
            "content": {"text/event-stream": {"schema": SSE_MESSAGE}},
        },
        **errors(404),
    },
    summary="Stream a run's events (SSE)",
)
async def stream_events(
    run_id: RunId,
    auth: Auth,
    ctx: Ctx,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_SEQUENCE, description="Send events with a larger sequence.")
    ] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", include_in_schema=False)] = None,
) -> Response:
    """Sends every event after `Last-Event-ID` (or `?after=`, or from the start), then polls for
    new ones; a `: keep-alive` comment every 15 s; ends once the run is terminal and all its
    events are sent. Reconnect with `Last-Event-ID` to resume without gaps or repeats.

    Between stored events, streamed model calls' text arrives live as `event: llm.text.delta`
    messages with no `id:` line (ephemeral: they may be missed; the stored events are the truth)."""
    start = after or 0
    if last_event_id:
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        text = last_event_id.strip()
        if not (text.isascii() and text.isdigit() and int(text) <= MAX_SEQUENCE):
            raise ValidationError.from_problems(
                [{"path": "Last-Event-ID", "message": "Must be an event sequence number"}]
            )
        start = max(start, int(text))
    await _run_progress(ctx.rt, auth.workspace_id, run_id)  # 404 before the stream starts
    return StreamingResponse(
        _stream(ctx, auth.workspace_id, run_id, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def format_sse(event: EventOut) -> str:
    data = event.model_dump_json(by_alias=True)
    return f"id: {event.sequence}\nevent: {event.event_type}\ndata: {data}\n\n"


async def _stream(ctx: ApiContext, workspace_id: str, run_id: str, last: int) -> AsyncIterator[str]:
    rt = ctx.rt
    idle_s = 0.0
    async with rt.live.subscribe(run_id) as deltas:
        while True:
            try:
                status, seq = await _run_progress(rt, workspace_id, run_id)
            except NotFoundError:  # the run (or its workspace) was deleted while streaming
                return
            for delta in drain(deltas):  # published before the events read next
                yield delta_sse(delta)
            while last < seq:
                batch = await events_between(rt, run_id, last, min(seq, last + _BATCH))
                if not batch:  # cannot happen (events commit with the counter); never spin on it
                    break
                for event in batch:
                    yield format_sse(event)
                last = batch[-1].sequence
                idle_s = 0.0
            if status in TERMINAL and last >= seq:
                return
            if idle_s >= ctx.sse_keepalive_s:
                yield ": keep-alive\n\n"
                idle_s = 0.0
            async for delta in deltas_for(deltas, ctx.sse_poll_s):  # instead of sleeping
                yield delta_sse(delta)
            idle_s += ctx.sse_poll_s
