"""Time travel over HTTP: a run's fork points, forks, replays with recorded tools, lineage
(docs/time-travel.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import ok, readable
from stevora.api.schemas.time_travel import ForkIn, ReplayIn
from stevora.db import forks as db_forks
from stevora.engine import fork as forking
from stevora.engine.steps.llm_recorded import RECORDED, replay_report
from stevora.errors import ValidationError
from stevora.runtime import Runtime

router = APIRouter(prefix="/workflow-runs", tags=["workflow-runs"])

RunId = Annotated[str, Path(description="The workflow run id")]


@router.get("/{run_id}/checkpoints", responses=errors(404), summary="Every point a run can be forked at")
async def checkpoints(run_id: RunId, auth: Auth, ctx: Ctx) -> Response:
    """In order: before each step visit, and inside an llm step before each round's model call;
    each with the state as it was there and what happened next (model call, tool call ids)."""
    run = await _run(ctx.rt, auth.workspace_id, run_id)
    points, _ = await forking.fork_points(ctx.rt.pool, run)
    return ok([{**p.to_dict(), "state": readable(p.state)} for p in points])


@router.get("/{run_id}/lineage", responses=errors(404), summary="A run's origin, forks and replay report")
async def lineage(run_id: RunId, auth: Auth, ctx: Ctx) -> Response:
    run = await _run(ctx.rt, auth.workspace_id, run_id)
    forks = await db_forks.list_forks(ctx.rt.pool, run_id)
    data: dict[str, Any] = {
        "runId": run_id,
        "forkedFrom": forking.fork_view(run) or None,
        "replayOf": run["replay_of"],
        "edits": readable(run["fork_edits"]),
        "forks": [
            {
                "runId": f["id"],
                "status": f["status"],
                "stepName": f["forked_at_step"],
                "round": f["forked_at_round"],
                "replay": f["replay_of"] is not None,
            }
            for f in forks
        ],
    }
    if run["replay_of"] is not None:
        data["toolCalls"] = await replay_report(ctx.rt.pool, run_id)
    return ok(data)


@router.post(
    "/{run_id}/fork", status_code=201, responses=errors(400, 404), summary="Fork a run at a checkpoint"
)
async def fork(
    run_id: RunId,
    auth: Auth,
    ctx: Ctx,
    body: Annotated[ForkIn, Body(examples=[{"at": {"step": "agent", "round": 3}}])],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> Response:
    """201 with a new run that inherits everything before `at` (never executed again) and goes on
    from there with `edits` applied; 200 with the existing fork when `Idempotency-Key` was used
    (409 when the key was used for another kind of request)."""
    raw = body.model_dump(by_alias=True, exclude_unset=True)
    plan = await forking.plan_fork(ctx.rt, auth.workspace_id, run_id, raw["at"], raw.get("edits"))
    return await _create(ctx.rt, auth.workspace_id, plan, idempotency_key or body.idempotency_key)


@router.post("/{run_id}/replay", status_code=201, responses=errors(400, 404), summary="Replay a run")
async def replay(
    run_id: RunId,
    auth: Auth,
    ctx: Ctx,
    body: Annotated[ReplayIn, Body(examples=[{"model": "gpt-4o-mini", "tools": "recorded"}])],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> Response:
    """The run driven again from its first step with another model / system prompt / definition
    version; with `tools: "recorded"` (the default) each tool call is answered from the origin's
    recorded result, and an unmatched call fails (`unmatched: "error"`, the default) or runs live
    (`unmatched: "live"`)."""
    raw = body.model_dump(by_alias=True, exclude_unset=True)
    plan = await plan_replay_body(ctx.rt, auth.workspace_id, run_id, raw)
    return await _create(ctx.rt, auth.workspace_id, plan, idempotency_key or body.idempotency_key)


REPLAY_FIELDS = {"tools", "model", "systemPrompt", "step", "definitionVersion", "unmatched", "idempotencyKey"}


async def plan_replay_body(
    rt: Runtime, workspace_id: str, run_id: str, body: dict[str, Any]
) -> forking.ForkPlan:
    """A replay request's body (one run's, or a bulk replay's options) checked into a plan."""
    tools = body.get("tools", RECORDED)
    if tools != RECORDED:
        raise ValidationError.from_problems([{"path": "tools", "message": "only 'recorded' is supported"}])
    return await forking.plan_replay(
        rt,
        workspace_id,
        run_id,
        model=body.get("model"),
        system_prompt=body.get("systemPrompt"),
        step=body.get("step"),
        definition_version=body.get("definitionVersion"),
        unmatched=body.get("unmatched", "error"),
    )


async def _create(rt: Runtime, workspace_id: str, plan: forking.ForkPlan, key: str | None) -> Response:
    run, created = await forking.make(rt, plan, key)
    return ok(run_view(run), 201 if created else 200)


def run_view(run: Any) -> dict[str, Any]:
    return {
        "id": run["id"],
        "status": run["status"],
        "definitionId": run["definition_id"],
        "forkedFrom": forking.fork_view(run) or None,
        "replayOf": run["replay_of"],
        "edits": readable(run["fork_edits"]),
        "state": readable(run["state"]),
        "createdAt": run["created_at"].isoformat(),
    }


async def _run(rt: Runtime, workspace_id: str, run_id: str) -> Any:
    async with rt.pool.acquire() as conn:
        return await forking.fork_origin(conn, workspace_id, run_id)
