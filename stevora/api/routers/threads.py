"""`/v1/threads`: conversations whose turns are runs; `POST /v1/workflow-runs/{id}/messages`.

Sending a message (and what it does while a turn is active) is `stevora.engine.threads`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Path, Request
from starlette.responses import Response, StreamingResponse

from stevora.api.deps import ApiContext, Auth, Ctx, Paging
from stevora.api.openapi import errors
from stevora.api.routers.events import MAX_SEQUENCE, SSE_MESSAGE, TERMINAL, events_between
from stevora.api.schemas.envelope import Envelope, Page, ok, page
from stevora.api.schemas.threads import (
    MessageIn,
    RunMessageIn,
    RunMessageOut,
    SentOut,
    ThreadCreate,
    ThreadMessageOut,
    ThreadOut,
)
from stevora.db.reads import runs as run_reads
from stevora.db.reads import threads as thread_reads
from stevora.db.reads.threads import ThreadRow
from stevora.engine import threads
from stevora.errors import NotFoundError, ValidationError
from stevora.live import delta_sse, deltas_for
from stevora.runtime import Runtime

router = APIRouter(prefix="/threads", tags=["threads"])
runs_router = APIRouter(prefix="/workflow-runs", tags=["workflow-runs"])
ThreadId = Annotated[str, Path(description="A thread id (thr_...).")]
_METADATA = "metadata."


async def _thread(rt: Runtime, workspace_id: str, thread_id: str) -> ThreadRow:
    row = await thread_reads.get(rt.pool, workspace_id, thread_id)
    if row is None:
        raise NotFoundError("Thread not found", details={"threadId": thread_id})
    return row


async def _out(rt: Runtime, row: ThreadRow) -> ThreadOut:
    turns = await thread_reads.turns(rt.pool, row.id)
    open_ids = [t.id for t in turns if t.status in ("PENDING", "RUNNING", "WAITING", "PAUSED")]
    return ThreadOut.model_validate(
        {**row.as_dict(), "active_run_id": open_ids[0] if open_ids else None, "queued_run_ids": open_ids[1:]}
    )


@router.post(
    "",
    status_code=201,
    response_model=Envelope[ThreadOut],
    responses=errors(400, 404),
    summary="Create a thread",
)
async def create_thread(body: ThreadCreate, auth: Auth, ctx: Ctx) -> Response:
    """A conversation with an agent definition (`definitionId`, or `definitionName` for its newest
    version). Each message to it starts a turn: a run with input `{"content": ...}`. With
    `forkOf` instead: a copy of that thread whose first turn continues its conversation."""
    if body.fork_of is not None:
        return ok(await _out(ctx.rt, await threads.fork_thread(ctx.rt, auth.workspace_id, body.fork_of)), 201)
    if (body.definition_id is None) == (body.definition_name is None):
        raise ValidationError.from_problems(
            [{"path": "definitionId", "message": "give exactly one of definitionId and definitionName"}]
        )
    definition_id = body.definition_id
    if definition_id is None:
        assert body.definition_name is not None
        definition_id = await thread_reads.latest_definition(
            ctx.rt.pool, auth.workspace_id, body.definition_name
        )
        if definition_id is None:
            raise NotFoundError(
                "Workflow definition not found", details={"definitionName": body.definition_name}
            )
    row = await threads.create_thread(
        ctx.rt,
        auth.workspace_id,
        definition_id,
        metadata=dict(body.metadata),
        state=body.state,
        on_active=body.on_active,
    )
    return ok(await _out(ctx.rt, row), 201)


@router.get("", response_model=Page[ThreadOut], summary="List threads")
async def list_threads(request: Request, auth: Auth, ctx: Ctx, paging: Paging) -> Response:
    """Newest first. `?metadata.<key>=<value>` (repeatable) keeps the threads whose metadata has
    every such pair."""
    metadata = {k[len(_METADATA) :]: v for k, v in request.query_params.items() if k.startswith(_METADATA)}
    rows, total = await thread_reads.listed(
        ctx.rt.pool, auth.workspace_id, metadata, offset=paging.offset, limit=paging.page_size
    )
    data = [await _out(ctx.rt, r) for r in rows]
    return page(data, page=paging.page, page_size=paging.page_size, total=total)


@router.get("/{thread_id}", response_model=Envelope[ThreadOut], responses=errors(404), summary="Get a thread")
async def get_thread(thread_id: ThreadId, auth: Auth, ctx: Ctx) -> Response:
    return ok(await _out(ctx.rt, await _thread(ctx.rt, auth.workspace_id, thread_id)))


@router.delete(
    "/{thread_id}", response_model=Envelope[ThreadOut], responses=errors(404), summary="Delete a thread"
)
async def delete_thread(thread_id: ThreadId, auth: Auth, ctx: Ctx) -> Response:
    """Deletes the thread; a turn still active is cancelled (the turns' runs stay, with their traces)."""
    row = await threads.delete_thread(ctx.rt, auth.workspace_id, thread_id)
    return ok(ThreadOut.model_validate(row.as_dict()))


@router.post(
    "/{thread_id}/messages",
    status_code=201,
    response_model=Envelope[SentOut],
    responses={
        202: {"model": Envelope[SentOut], "description": "enqueue / steer: accepted for later"},
        **errors(400, 404, 409),
    },
    summary="Send a message (start a turn)",
)
async def send_message(thread_id: ThreadId, body: MessageIn, auth: Auth, ctx: Ctx) -> Response:
    """201 with the new turn's `runId`. While a turn is active, `onActive` (default: the thread's)
    decides: `reject` → 409 THREAD_BUSY naming the active run; `enqueue` → 202, the turn starts
    when those before it end; `interrupt` → the active run is CANCELLED (reason `interrupted`) and
    the new turn starts (201); `steer` → 202, the message goes into the active run's llm step at
    its next round boundary."""
    sent = await threads.send(ctx.rt, auth.workspace_id, thread_id, body.content, body.on_active)
    out = SentOut(
        run_id=sent.run_id,
        policy=sent.policy,  # type: ignore[arg-type]
        message_id=sent.message_id,
        interrupted_run_id=sent.interrupted_run_id,
    )
    return ok(out, 202 if sent.queued else 201)


@router.get(
    "/{thread_id}/messages",
    response_model=Envelope[list[ThreadMessageOut]],
    responses=errors(404),
    summary="The conversation",
)
async def list_messages(thread_id: ThreadId, auth: Auth, ctx: Ctx) -> Response:
    """Every message in order (user, assistant, tool), each with the `runId` of its turn; steered
    messages carry the round they went into."""
    row = await _thread(ctx.rt, auth.workspace_id, thread_id)
    entries = await threads.conversation(ctx.rt, row)
    return ok([ThreadMessageOut.model_validate(e, from_attributes=True) for e in entries])


@runs_router.post(
    "/{run_id}/messages",
    status_code=202,
    response_model=Envelope[RunMessageOut],
    responses=errors(400, 404, 409),
    summary="Steer a running llm step",
)
async def steer_run(
    run_id: Annotated[str, Path(description="A workflow run id (wfrun_...).")],
    body: RunMessageIn,
    auth: Auth,
    ctx: Ctx,
) -> Response:
    """The message goes into the run's llm step at its next round boundary, after that round's
    tool results (a `MESSAGE_INJECTED` event says which round). 409 when the run has ended."""
    row = await threads.steer_run(ctx.rt, auth.workspace_id, run_id, body.content)
    return ok(RunMessageOut.model_validate(dict(row)), 202)


@router.get(
    "/{thread_id}/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "`text/event-stream` of every turn's events, oldest turn first: `id: "
            "<runId>:<sequence>`, `event: <eventType>`, `data: <Event>` (its `workflowRunId` names the "
            "turn); and, id-less, `event: llm.text.delta` while a turn's model call streams",
            "content": {"text/event-stream": {"schema": SSE_MESSAGE}},
        },
        **errors(400, 404),
    },
    summary="Stream a thread's events across turns (SSE)",
)
async def stream_thread(
    thread_id: ThreadId,
    auth: Auth,
    ctx: Ctx,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", include_in_schema=False)] = None,
) -> Response:
    """Sends the events of every turn after `Last-Event-ID` (`<runId>:<sequence>`, as each message's
    `id`; from the first turn without it), then follows new events and new turns until the client
    goes or the thread is deleted; a `: keep-alive` comment every 15 s."""
    resume: tuple[str, int] | None = None
    if last_event_id:
        run_id, _, seq = last_event_id.strip().rpartition(":")
        if not (run_id and seq.isascii() and seq.isdigit() and int(seq) <= MAX_SEQUENCE):
            raise ValidationError.from_problems(
                [{"path": "Last-Event-ID", "message": "Must be <runId>:<sequence>, as a message's id"}]
            )
        resume = (run_id, int(seq))
    await _thread(ctx.rt, auth.workspace_id, thread_id)  # 404 before the stream starts
    return StreamingResponse(
        _thread_events(ctx, auth.workspace_id, thread_id, resume),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _thread_events(
    ctx: ApiContext, workspace_id: str, thread_id: str, resume: tuple[str, int] | None
) -> AsyncIterator[str]:
    rt = ctx.rt
    sent: dict[str, int] = {}  # run -> last sequence sent
    ended: set[str] = set()  # turns whose every event was sent
    if resume is not None:
        sent[resume[0]] = resume[1]
    idle_s = 0.0
    while True:
        if await thread_reads.get(rt.pool, workspace_id, thread_id) is None:
            return  # deleted while streaming
        turns = await thread_reads.turns(rt.pool, thread_id)
        if resume is not None:  # the turns before the one resumed were sent before
            ids = [t.id for t in turns]
            if resume[0] in ids:
                ended.update(ids[: ids.index(resume[0])])
            resume = None
        active: str | None = None
        for turn in turns:
            if turn.id in ended:
                continue
            status, seq = await _progress(rt, workspace_id, turn.id)
            last = sent.get(turn.id, 0)
            while last < seq:
                batch = await events_between(rt, turn.id, last, min(seq, last + 500))
                if not batch:
                    break
                for event in batch:
                    data = event.model_dump_json(by_alias=True)
                    yield f"id: {turn.id}:{event.sequence}\nevent: {event.event_type}\ndata: {data}\n\n"
                last = sent[turn.id] = batch[-1].sequence
                idle_s = 0.0
            if status in TERMINAL and last >= seq:
                ended.add(turn.id)
            elif active is None:
                active = turn.id
        if idle_s >= ctx.sse_keepalive_s:
            yield ": keep-alive\n\n"
            idle_s = 0.0
        if active is None:
            await asyncio.sleep(ctx.sse_poll_s)
        else:
            async with rt.live.subscribe(active) as deltas:
                async for delta in deltas_for(deltas, ctx.sse_poll_s):
                    yield delta_sse(delta)
        idle_s += ctx.sse_poll_s


async def _progress(rt: Runtime, workspace_id: str, run_id: str) -> tuple[str, int]:
    found = await run_reads.progress(rt.pool, workspace_id, run_id)
    return found if found is not None else ("CANCELLED", 0)
