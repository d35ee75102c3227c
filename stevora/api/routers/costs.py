"""`GET /v1/workflow-runs/{id}/cost` and `GET /v1/cost/summary`, computed from `llm_calls`.

Both count every recorded call, completed or failed (a failed call that used tokens was paid
for); the per-run totals are exactly the sums over the listed calls.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx
from stevora.api.openapi import errors
from stevora.api.routers.runs import load_run
from stevora.api.schemas.envelope import Envelope, ok
from stevora.api.schemas.traces import CostCallOut, CostSummaryOut, ModelCostOut, RunCostOut
from stevora.db.reads import costs as cost_reads
from stevora.errors import ValidationError

runs_router = APIRouter(prefix="/workflow-runs", tags=["costs"])
router = APIRouter(prefix="/cost", tags=["costs"])
RunId = Annotated[str, Path(description="A workflow run id (wfrun_...).")]
_ISO = {"format": "date-time"}


@runs_router.get(
    "/{run_id}/cost", response_model=Envelope[RunCostOut], responses=errors(404), summary="A run's LLM cost"
)
async def run_cost(run_id: RunId, auth: Auth, ctx: Ctx) -> Response:
    await load_run(ctx.rt, auth.workspace_id, run_id)
    calls = [CostCallOut.model_validate(c) for c in await cost_reads.of_run(ctx.rt.pool, run_id)]
    cost = RunCostOut(
        workflow_run_id=run_id,
        total_cost_usd=round(sum(c.cost_usd for c in calls), 10),
        total_input_tokens=sum(c.input_tokens for c in calls),
        total_output_tokens=sum(c.output_tokens for c in calls),
        calls=calls,
    )
    return ok(cost)


def parse_instant(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValidationError.from_problems(
            [{"path": name, "message": "Must be an ISO 8601 date or date-time, e.g. 2026-04-02T12:00:00Z"}]
        ) from None


@router.get(
    "/summary",
    response_model=Envelope[CostSummaryOut],
    summary="The workspace's LLM cost",
)
async def cost_summary(
    auth: Auth,
    ctx: Ctx,
    from_: Annotated[
        str | None, Query(alias="from", description="Inclusive start (ISO 8601).", json_schema_extra=_ISO)
    ] = None,
    to: Annotated[str | None, Query(description="Exclusive end (ISO 8601).", json_schema_extra=_ISO)] = None,
    include_replays: Annotated[
        bool, Query(alias="includeReplays", description="Count the model calls of replays too.")
    ] = False,
) -> Response:
    """Totals and a per-model breakdown over calls created in [from, to); omitted = unbounded.
    A fork's inherited calls are its origin's (counted once, there); replays are left out unless
    `includeReplays=true` (docs/time-travel.md)."""
    start, end = parse_instant(from_, "from"), parse_instant(to, "to")
    rows = await cost_reads.by_model(ctx.rt.pool, auth.workspace_id, start, end, include_replays)
    run_count = await cost_reads.run_count(ctx.rt.pool, auth.workspace_id, start, end, include_replays)
    by_model = [ModelCostOut.model_validate(r) for r in rows]
    summary = CostSummaryOut.model_validate(
        {
            "from": start,
            "to": end,
            "total_cost_usd": round(sum(m.cost_usd for m in by_model), 10),
            "total_input_tokens": sum(m.input_tokens for m in by_model),
            "total_output_tokens": sum(m.output_tokens for m in by_model),
            "run_count": run_count,
            "call_count": sum(m.calls for m in by_model),
            "by_model": by_model,
        }
    )
    return ok(summary)
