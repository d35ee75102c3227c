"""`/v1/workflow-runs/{id}/llm-calls` and `/tool-traces`: what the model was asked and answered,
and every tool call it made, in execution order."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy import func, select
from starlette.responses import Response

from stevora.api.db import fetch_all
from stevora.api.deps import Auth, Ctx
from stevora.api.openapi import errors
from stevora.api.routers.runs import load_run
from stevora.api.schemas.envelope import Envelope, ok
from stevora.api.schemas.traces import LlmCallOut, ToolTraceOut
from stevora.db.models import LlmCall, StepRun, ToolTrace

router = APIRouter(prefix="/workflow-runs", tags=["traces"])
RunId = Annotated[str, Path(description="A workflow run id (wfrun_...).")]
StepName = Annotated[
    str | None, Query(alias="stepName", max_length=100, description="Only this step's records.")
]
_CALLS = LlmCall.__table__
_TRACES = ToolTrace.__table__


@router.get(
    "/{run_id}/llm-calls",
    response_model=Envelope[list[LlmCallOut]],
    responses=errors(404),
    summary="A run's LLM calls",
)
async def list_llm_calls(run_id: RunId, auth: Auth, ctx: Ctx, step_name: StepName = None) -> Response:
    """Completed and failed calls (failed ones include fallback attempts), oldest first."""
    await load_run(ctx.rt, auth.workspace_id, run_id)
    stmt = select(_CALLS).where(_CALLS.c.workflow_run_id == run_id)
    if step_name is not None:
        stmt = stmt.where(_CALLS.c.step_name == step_name)
    stmt = stmt.order_by(_CALLS.c.created_at, _CALLS.c.round, _CALLS.c.id)
    return ok([LlmCallOut.model_validate(r) for r in await fetch_all(ctx.rt, stmt)])


@router.get(
    "/{run_id}/tool-traces",
    response_model=Envelope[list[ToolTraceOut]],
    responses=errors(404),
    summary="A run's tool calls",
)
async def list_tool_traces(run_id: RunId, auth: Auth, ctx: Ctx, step_name: StepName = None) -> Response:
    """One record per executed tool call, in execution order (round, then position in the round)."""
    await load_run(ctx.rt, auth.workspace_id, run_id)
    # Rounds in the order their model calls were made, then calls in the order of the model's
    # answer (`sequence`): parallel calls finish (and are committed) in any order. A `tool` step's
    # call has no model call: it sorts by its own commit time.
    stmt = (
        select(_TRACES)
        .outerjoin(_CALLS, _CALLS.c.id == _TRACES.c.llm_call_id)
        .where(_TRACES.c.workflow_run_id == run_id)
    )
    if step_name is not None:
        stmt = stmt.join(StepRun.__table__, StepRun.id == _TRACES.c.step_run_id).where(
            StepRun.step_name == step_name
        )
    stmt = stmt.order_by(
        func.coalesce(_CALLS.c.created_at, _TRACES.c.created_at), _CALLS.c.id, _TRACES.c.sequence
    )
    return ok([ToolTraceOut.model_validate(r) for r in await fetch_all(ctx.rt, stmt)])
