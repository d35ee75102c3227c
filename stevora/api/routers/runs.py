"""`/v1/workflow-runs`: create (idempotent), list, get, the cancel / retry / pause / resume
commands and tool outputs. Mutations go through `stevora.engine.commands` (the run's lifecycle)
and `stevora.engine.steps.awaited.client` (tool outputs), which own the guarded transitions."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx, Paging
from stevora.api.openapi import errors
from stevora.api.request_wait import RequestedWait, applied, settle
from stevora.api.routers.definitions import store_definition
from stevora.api.schemas.envelope import Envelope, Page, ok, page
from stevora.api.schemas.runs import (
    DefinitionRef,
    ResumeIn,
    RunCreate,
    RunDetailOut,
    RunListItemOut,
    RunOut,
    StepRunOut,
    ToolOutputsIn,
)
from stevora.db import awaited as db_awaited
from stevora.db import budgets as db_budgets
from stevora.db import concurrency, map_items
from stevora.db.reads import definitions as definition_reads
from stevora.db.reads import runs as run_reads
from stevora.db.reads.runs import RunFilters, RunRow
from stevora.definitions import Budget, parse_definition
from stevora.engine import commands, limits
from stevora.engine.budget import update_budget
from stevora.engine.steps.awaited import client as tool_outputs
from stevora.errors import ConflictError, NotFoundError, ValidationError
from stevora.runtime import Runtime
from stevora.statuses import RunStatus

router = APIRouter(prefix="/workflow-runs", tags=["workflow-runs"])
RunId = Annotated[str, Path(description="A workflow run id (wfrun_...).")]
_NEW_RUN_DEFAULTS = {
    "total_cost_cents": 0.0,
    "total_input_tokens": 0,
    "total_output_tokens": 0,
    "completed_at": None,
    "failed_at": None,
    "cancelled_at": None,
}
ADHOC_NAME = "adhoc"


async def load_run(rt: Runtime, workspace_id: str, run_id: str) -> RunRow:
    """The run as stored, or `NotFoundError` (also for another workspace's run)."""
    row = await run_reads.get(rt.pool, workspace_id, run_id)
    if row is None:
        raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
    return row


async def with_required_action(rt: Runtime, rows: Sequence[Mapping[Any, Any]]) -> list[dict[str, Any]]:
    """The rows with their `requiredAction` (pending client-executed tool calls), one query for all."""
    waiting = [r["id"] for r in rows if r["status"] == RunStatus.WAITING]
    by_run: dict[str, list[Any]] = {}
    for call in await db_awaited.pending_client_calls(rt.pool, waiting) if waiting else []:
        by_run.setdefault(call["workflow_run_id"], []).append(call)
    return [{**r, "required_action": tool_outputs.required_action(by_run.get(r["id"], []))} for r in rows]


async def run_out(rt: Runtime, workspace_id: str, run_id: str) -> RunOut:
    (row,) = await with_required_action(rt, [await load_run(rt, workspace_id, run_id)])
    return RunOut.model_validate(row)


def step_run_out(row: Mapping[Any, Any], fanout: Mapping[Any, Any] | None = None) -> StepRunOut:
    started, completed = row["started_at"], row["completed_at"]
    duration = int((completed - started).total_seconds() * 1000) if started and completed else None
    return StepRunOut.model_validate({**row, "duration_ms": duration, "map": map_progress(fanout)})


def map_progress(fanout: Mapping[Any, Any] | None) -> dict[str, Any] | None:
    """A `map_steps` row as the API shows it (None: not a map step run, or not started yet)."""
    if fanout is None:
        return None
    return {**fanout, "done": fanout["completed"] + fanout["failed"]}


@router.post(
    "",
    status_code=201,
    response_model=Envelope[RunOut],
    responses={
        200: {"model": Envelope[RunOut], "description": "The existing run whose idempotencyKey matched"},
        **errors(404),
    },
    summary="Start a workflow run",
)
async def create_run(
    body: RunCreate, auth: Auth, ctx: Ctx, request: Request, wait: RequestedWait
) -> Response:
    """201 with a new PENDING run; 200 with the existing run when `idempotencyKey` was used before
    in this workspace (race-safe: the unique index decides).

    With `definition` instead of `definitionId` the run's definition is given inline (tools and
    all) and stored on first use as `adhoc` (or its `name`) at a version digesting its content.
    With `?wait=N` / `Prefer: wait=N` the answer waits until the run is settled (see `wait`)."""
    problem = body.definition_problem()
    if problem is not None:
        raise ValidationError.from_problems([problem])
    definition_id = body.definition_id
    if definition_id is None:
        assert body.definition is not None  # definition_problem() checked it
        # Checked before the definition is stored, so a refused request stores nothing.
        limits.check_definition(ctx.settings, body.definition, "definition")
        limits.check_run_input(ctx.settings, body.input)
        definition_id = await adhoc_definition(ctx.rt, auth.workspace_id, body.definition)
    record, created = await commands.create_run(
        ctx.rt,
        auth.workspace_id,
        definition_id,
        body.input,
        body.idempotency_key,
        body.budget,
        body.concurrency,
        body.priority,
    )
    status = 201 if created else 200
    if wait is not None:
        await settle(ctx.rt, request, auth.workspace_id, record["id"], wait)
        return applied(ok(await run_out(ctx.rt, auth.workspace_id, record["id"]), status), wait)
    if created:
        # The row as inserted: the columns RUN_COLUMNS leaves out still hold their defaults.
        row: Mapping[Any, Any] = {
            **_NEW_RUN_DEFAULTS,
            **dict(record),
            "idempotency_key": body.idempotency_key,
            "updated_at": record["created_at"],
        }
    else:
        row = await load_run(ctx.rt, auth.workspace_id, record["id"])
    return ok(RunOut.model_validate(row), status)


async def adhoc_definition(rt: Runtime, workspace_id: str, body: dict[str, Any]) -> str:
    """The id of the stored definition for an inline `definition` (stored now if new).

    Without `version` it is `adhoc-<digest of the content>`, so the same content reuses one stored
    definition and different content never collides; an explicit `(name, version)` that is stored
    with other content is a 409 CONFLICT (definitions are immutable)."""
    data = {"name": ADHOC_NAME, "version": "adhoc", **body}
    try:
        spec = parse_definition(data)
    except ValidationError as exc:
        problems = (exc.details or {}).get("errors", [])
        raise ValidationError.from_problems(
            [{**p, "path": f"definition.{p['path']}" if p["path"] else "definition"} for p in problems]
        ) from exc
    if "version" not in body:
        content = spec.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"version"})
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
        spec = spec.model_copy(update={"version": f"adhoc-{digest}"})
    row, created = await store_definition(rt, workspace_id, spec)
    dump = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    stored = (row["steps"], row["description"], row["input_schema"], row["default_params"])
    if not created and stored != (dump["steps"], spec.description, spec.input_schema, spec.default_params):
        raise ConflictError(
            f"Workflow definition '{spec.name}' version '{spec.version}' exists with other content "
            "(definitions are immutable: change the version, or leave it out)",
            details={"name": spec.name, "version": spec.version},
        )
    definition_id: str = row["id"]
    return definition_id


def _list_item(row: Mapping[str, Any]) -> RunListItemOut:
    omitted = [name for name in run_reads.LARGE_COLUMNS if row[f"{name}_omitted"]]
    definition = {"name": row["definition_name"], "version": row["definition_version"]}
    return RunListItemOut.model_validate(
        {**row, "omitted_fields": omitted, "definition": definition if row["definition_name"] else None}
    )


@router.get("", response_model=Page[RunListItemOut], summary="List workflow runs")
async def list_runs(
    auth: Auth,
    ctx: Ctx,
    paging: Paging,
    status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
    definition_id: Annotated[
        str | None, Query(alias="definitionId", description="Only runs of this definition.")
    ] = None,
    parent_run_id: Annotated[
        str | None,
        Query(
            alias="parentRunId",
            description="Only the child runs this run started (workflows called as tools, map step items).",
        ),
    ] = None,
    definition_name: Annotated[
        str | None,
        Query(
            alias="definitionName", max_length=200, description="Only runs of this workflow (any version)."
        ),
    ] = None,
) -> Response:
    """Newest first. Items leave out an `input`, `state` or `output` whose JSON is over its share of
    `STEVORA_MAX_LIST_PAGE_BYTES` (a third of the page's bytes per item): it is `null` and named in
    `omittedFields`."""
    filters = RunFilters(
        status=status,
        definition_id=definition_id,
        parent_run_id=parent_run_id,
        definition_name=definition_name,
    )
    total = await run_reads.count(ctx.rt.pool, auth.workspace_id, filters)
    rows = []
    if paging.offset < total:  # the page query is skipped past the end
        rows = await run_reads.page(
            ctx.rt.pool,
            auth.workspace_id,
            filters,
            offset=paging.offset,
            limit=paging.page_size,
            page_bytes=ctx.settings.max_list_page_bytes,
        )
    data = [_list_item(r) for r in await with_required_action(ctx.rt, rows)]
    return page(data, page=paging.page, page_size=paging.page_size, total=total)


@router.get(
    "/{run_id}",
    response_model=Envelope[RunDetailOut],
    responses=errors(404),
    summary="Get a run with its steps",
)
async def get_run(run_id: RunId, auth: Auth, ctx: Ctx, request: Request, wait: RequestedWait) -> Response:
    """With `?wait=N` / `Prefer: wait=N`: a long poll, answered once the run is settled."""
    if wait is not None:
        await load_run(ctx.rt, auth.workspace_id, run_id)  # 404 at once, not after the wait
        await settle(ctx.rt, request, auth.workspace_id, run_id, wait)
    return applied(ok(await run_detail(ctx.rt, auth.workspace_id, run_id)), wait)


async def run_detail(rt: Runtime, workspace_id: str, run_id: str) -> RunDetailOut:
    """The run as `GET /workflow-runs/{id}` returns it: with its step runs and `requiredAction`."""
    (run,) = await with_required_action(rt, [await load_run(rt, workspace_id, run_id)])
    steps = await run_reads.steps(rt.pool, run_id)
    fanouts = {m["step_run_id"]: m for m in await map_items.maps_of_run(rt.pool, run_id)}
    definition = await definition_reads.ref(rt.pool, run["definition_id"])
    assert definition is not None  # a foreign key guarantees it
    used = await db_budgets.usage(rt.pool, run_id) if run["budget"] is not None else None
    queued = run["queued_at"] is not None and run["status"] in (RunStatus.PENDING, RunStatus.WAITING)
    return RunDetailOut.model_validate(
        {
            **run,
            "queue_position": await concurrency.queue_position(rt.pool, run_id) if queued else None,
            "step_runs": [step_run_out(s, fanouts.get(s["id"])) for s in steps],
            "definition": DefinitionRef.model_validate(definition),
            "budget_used": None
            if used is None
            else {
                "cost_cents": used["total_cost_cents"],
                "model_calls": used["model_calls"],
                "tool_calls": used["tool_calls"],
            },
        }
    )


_COMMAND_ERRORS = errors(404, 409)


@router.post(
    "/{run_id}/cancel", response_model=Envelope[RunOut], responses=_COMMAND_ERRORS, summary="Cancel a run"
)
async def cancel_run(run_id: RunId, auth: Auth, ctx: Ctx) -> Response:
    """PENDING, RUNNING, WAITING or PAUSED → CANCELLED; open steps and approvals are cancelled."""
    await commands.cancel_run(ctx.rt, auth.workspace_id, run_id)
    return ok(await run_out(ctx.rt, auth.workspace_id, run_id))


@router.post(
    "/{run_id}/retry", response_model=Envelope[RunOut], responses=_COMMAND_ERRORS, summary="Retry a run"
)
async def retry_run(run_id: RunId, auth: Auth, ctx: Ctx) -> Response:
    """FAILED → RUNNING: the failed step runs again with a fresh attempt budget."""
    await commands.retry_run(ctx.rt, auth.workspace_id, run_id)
    return ok(await run_out(ctx.rt, auth.workspace_id, run_id))


@router.post(
    "/{run_id}/pause", response_model=Envelope[RunOut], responses=_COMMAND_ERRORS, summary="Pause a run"
)
async def pause_run(run_id: RunId, auth: Auth, ctx: Ctx) -> Response:
    """RUNNING → PAUSED; the worker stops at its next checkpoint. Resume with `/resume`."""
    await commands.pause_run(ctx.rt, auth.workspace_id, run_id)
    return ok(await run_out(ctx.rt, auth.workspace_id, run_id))


@router.post(
    "/{run_id}/resume",
    response_model=Envelope[RunOut],
    responses=_COMMAND_ERRORS,
    summary="Signal or un-pause a run",
)
async def resume_run(
    run_id: RunId, auth: Auth, ctx: Ctx, body: Annotated[ResumeIn | None, Body()] = None
) -> Response:
    """With `signalType`: deliver the signal an `external_event` step waits for (`payload` is
    merged into state; a different signal → 409 SIGNAL_MISMATCH). Without: un-pause a PAUSED run;
    a run in any other status answers 409 INVALID_STATE_TRANSITION naming its status and what to
    do instead (the body is valid — what it asks for does not fit the run's status)."""
    body = body or ResumeIn()
    await commands.resume_run(ctx.rt, auth.workspace_id, run_id, body.signal_type, body.payload)
    return ok(await run_out(ctx.rt, auth.workspace_id, run_id))


@router.post(
    "/{run_id}/tool-outputs",
    response_model=Envelope[RunDetailOut],
    responses=errors(400, 404, 409),
    summary="Submit outputs of client-executed tool calls",
)
async def submit_tool_outputs(
    run_id: RunId, body: ToolOutputsIn, auth: Auth, ctx: Ctx, request: Request, wait: RequestedWait
) -> Response:
    """Answer some or all of the calls in the run's `requiredAction`. Each accepted item writes its
    tool trace and `TOOL_CALL_COMPLETED` (or `TOOL_CALL_FAILED` for `error`) exactly once; when the
    last pending call is answered the run resumes and the model gets every result. Resubmitting
    exactly what was recorded answers 200 (safe to retry after a lost response). The answer is the
    run as `GET` returns it; with `?wait=N` / `Prefer: wait=N`, once the run is settled again (its
    next `requiredAction`, or its end) or at the bound."""
    items = [
        tool_outputs.ToolOutput(i.tool_call_id, output=i.output, error=i.error) for i in body.tool_outputs
    ]
    await tool_outputs.submit_tool_outputs(ctx.rt, auth.workspace_id, run_id, items)
    await settle(ctx.rt, request, auth.workspace_id, run_id, wait)
    return applied(ok(await run_detail(ctx.rt, auth.workspace_id, run_id)), wait)


@router.post(
    "/{run_id}/budget",
    response_model=Envelope[RunDetailOut],
    responses=errors(400, 404, 409),
    summary="Change a run's budget",
)
async def set_budget(run_id: RunId, body: Budget, auth: Auth, ctx: Ctx) -> Response:
    """Set the limits the body gives (null removes one; fields left out keep their value), within
    the server's maximum (above it: 400 naming the field). A run waiting for its budget
    (`onBudgetExceeded: "pause"`) resumes. Allowed unless the run is COMPLETED or CANCELLED (409);
    a FAILED run keeps the new budget for `/retry`. The answer is the run as `GET` returns it."""
    await update_budget(ctx.rt, auth.workspace_id, run_id, body)
    return ok(await run_detail(ctx.rt, auth.workspace_id, run_id))
