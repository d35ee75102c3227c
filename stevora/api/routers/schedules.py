"""`/v1/schedules`: schedules that start runs on a clock (docs/triggers.md, docs/api/schedules.md).

The ticks themselves are run by the workers' due pass (`stevora.triggers.schedules`); these
routes create and change schedules, and start runs on request (trigger now, backfill).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx, Paging
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Envelope, Page, ok, page
from stevora.api.schemas.schedules import (
    BackfillBody,
    ScheduleCreate,
    ScheduleOut,
    ScheduleRun,
    ScheduleUpdate,
    TriggeredRun,
)
from stevora.clock import utcnow
from stevora.db import schedules as rows
from stevora.definitions.triggers import ScheduleTiming
from stevora.errors import NotFoundError, ValidationError
from stevora.runtime import Runtime
from stevora.triggers import schedule_store, schedules

router = APIRouter(prefix="/schedules", tags=["schedules"])
ScheduleId = Annotated[str, Path(description="A schedule id (sch_...).")]


async def _out(rt: Runtime, row: Any) -> ScheduleOut:
    last = await rows.last_runs(rt.pool, row["id"])
    return ScheduleOut.model_validate(
        {
            **dict(row),
            "version": row["definition_version"],
            "next_fire_times": schedules.upcoming(row, utcnow()),
            "last_runs": [ScheduleRun.model_validate(dict(r)) for r in last],
        }
    )


@router.post(
    "",
    status_code=201,
    response_model=Envelope[ScheduleOut],
    responses=errors(400, 404, 409),
    summary="Create",
)
async def create_schedule(body: ScheduleCreate, auth: Auth, ctx: Ctx) -> Response:
    """The definition must exist now; with `version: "latest"` each tick runs the newest version."""
    timing = ScheduleTiming.model_validate(body.model_dump(include=set(ScheduleTiming.model_fields)))
    row = await schedule_store.create(
        ctx.rt,
        auth.workspace_id,
        timing,
        name=body.name,
        definition_id=body.definition_id,
        definition_name=body.definition_name,
        version=body.version,
    )
    return ok(await _out(ctx.rt, row), 201)


@router.get("", response_model=Page[ScheduleOut], summary="List schedules")
async def list_schedules(auth: Auth, ctx: Ctx, paging: Paging) -> Response:
    found, total = await rows.list_schedules(ctx.rt.pool, auth.workspace_id, paging.offset, paging.page_size)
    data = [await _out(ctx.rt, r) for r in found]
    return page(data, page=paging.page, page_size=paging.page_size, total=total)


@router.get("/{schedule_id}", response_model=Envelope[ScheduleOut], responses=errors(404), summary="Get")
async def get_schedule(schedule_id: ScheduleId, auth: Auth, ctx: Ctx) -> Response:
    return ok(await _out(ctx.rt, await schedule_store.get(ctx.rt, auth.workspace_id, schedule_id)))


@router.patch(
    "/{schedule_id}", response_model=Envelope[ScheduleOut], responses=errors(400, 404, 409), summary="Change"
)
async def update_schedule(schedule_id: ScheduleId, body: ScheduleUpdate, auth: Auth, ctx: Ctx) -> Response:
    """`{"paused": true}` pauses, `{"paused": false}` resumes (ticks missed meanwhile are not run)."""
    changes = body.model_dump(include=body.model_fields_set)
    row = await schedule_store.update(ctx.rt, auth.workspace_id, schedule_id, changes)
    return ok(await _out(ctx.rt, row))


@router.delete(
    "/{schedule_id}", response_model=Envelope[ScheduleOut], responses=errors(404), summary="Delete"
)
async def delete_schedule(schedule_id: ScheduleId, auth: Auth, ctx: Ctx) -> Response:
    """Runs it started are left alone."""
    row = await rows.delete_schedule(ctx.rt.pool, auth.workspace_id, schedule_id)
    if row is None:
        raise NotFoundError("Schedule not found", details={"scheduleId": schedule_id})
    return ok(
        ScheduleOut.model_validate(
            {**dict(row), "version": row["definition_version"], "next_fire_times": [], "last_runs": []}
        )
    )


@router.post(
    "/{schedule_id}/trigger",
    status_code=201,
    response_model=Envelope[TriggeredRun],
    responses=errors(404),
    summary="Run once now",
)
async def trigger_schedule(schedule_id: ScheduleId, auth: Auth, ctx: Ctx) -> Response:
    """One run now, with `scheduledAt` = now, whatever the overlap policy (also while paused)."""
    row = await schedule_store.get(ctx.rt, auth.workspace_id, schedule_id)
    run_id, scheduled_at = await schedules.trigger_now(ctx.rt, row)
    return ok(TriggeredRun(run_id=run_id, scheduled_at=scheduled_at), 201)


@router.post(
    "/{schedule_id}/backfill",
    response_model=Envelope[list[TriggeredRun]],
    responses=errors(400, 404),
    summary="Run the ticks of a past range",
)
async def backfill_schedule(schedule_id: ScheduleId, body: BackfillBody, auth: Auth, ctx: Ctx) -> Response:
    """Each tick in [from, to] runs once (a tick that already ran keeps its run); at most 1,000."""
    if body.to < body.from_:
        raise ValidationError.from_problems([{"path": "to", "message": "must not be before from"}])
    row = await schedule_store.get(ctx.rt, auth.workspace_id, schedule_id)
    started = await schedules.backfill(ctx.rt, row, body.from_, body.to)
    return ok([TriggeredRun(run_id=run_id, scheduled_at=tick) for tick, run_id in started])
