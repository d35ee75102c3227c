"""Runs in bulk over HTTP (docs/time-travel.md): replaying the last N runs of a definition (or a
list) with recorded tools and comparing each replay with its origin; retrying FAILED runs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx
from stevora.api.openapi import errors
from stevora.api.routers.costs import parse_instant
from stevora.api.routers.forks import REPLAY_FIELDS, plan_replay_body
from stevora.api.schemas.envelope import ok
from stevora.api.schemas.time_travel import BulkReplayIn, BulkRetryIn
from stevora.db import forks as db_forks
from stevora.engine import bulk
from stevora.engine import fork as forking
from stevora.engine.fork import ForkPlan
from stevora.errors import NotFoundError, StevoraError, ValidationError

router = APIRouter(tags=["time-travel"])

DEFAULT_LAST = 10


def _run_ids(value: Any, path: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValidationError.at(path, "must be a non-empty list of run ids")
    if len(value) > bulk.MAX_RUNS:
        raise ValidationError.at(path, f"at most {bulk.MAX_RUNS} runs")
    return list(dict.fromkeys(value))


def _selection(body: dict[str, Any]) -> tuple[str | None, list[str] | None]:
    """`definition` (a name) or `runIds`, exactly one."""
    name, ids = body.get("definition"), body.get("runIds")
    if (name is None) == (ids is None):
        raise ValidationError.at("definition", "give a definition name or runIds (one of them)")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValidationError.at("definition", "must be a definition name")
    return name, None if ids is None else _run_ids(ids, "runIds")


@router.post(
    "/replays", status_code=201, responses=errors(400), summary="Replay many runs with recorded tools"
)
async def bulk_replay(
    auth: Auth,
    ctx: Ctx,
    request: Annotated[
        BulkReplayIn,
        Body(examples=[{"definition": "support-agent", "last": 20, "model": "gpt-4.1-mini"}]),
    ],
) -> Response:
    """A replay (as `POST /workflow-runs/{id}/replay`, same options) of each of the last `last`
    ended runs of `definition` (any version; replays are not counted), or of each of `runIds`.
    Every replay is checked before any is made: an option that is wrong for the request is a 400
    naming the field and nothing is stored; a run that cannot be replayed is reported in its row.
    With `idempotencyKey`, each replay's key is `KEY:RUN_ID` (the same call again answers the same
    replays). `GET /replays/compare?runs=...` compares them with their origins."""
    body = request.model_dump(by_alias=True, exclude_unset=True)
    name, ids = _selection(body)
    if name is not None:
        last = body.get("last", DEFAULT_LAST)
        if not isinstance(last, int) or isinstance(last, bool) or not 1 <= last <= bulk.MAX_RUNS:
            raise ValidationError.at("last", f"must be an integer from 1 to {bulk.MAX_RUNS}")
        ids = await db_forks.last_runs(ctx.rt.pool, auth.workspace_id, name, last)
    assert ids is not None
    options = {k: v for k, v in body.items() if k in REPLAY_FIELDS}
    key = options.pop("idempotencyKey", None)
    if key is not None and (not isinstance(key, str) or not key):
        raise ValidationError.at("idempotencyKey", "must be a string")
    plans: list[tuple[str, ForkPlan | StevoraError]] = []
    for run_id in ids:
        try:
            plans.append((run_id, await plan_replay_body(ctx.rt, auth.workspace_id, run_id, options)))
        except ValidationError as exc:
            problems = (exc.details or {}).get("errors") or [{}]
            if problems[0].get("path") in REPLAY_FIELDS:
                raise  # the options are wrong for the request, not for this run
            plans.append((run_id, exc))
        except NotFoundError as exc:
            plans.append((run_id, exc))
    rows: list[dict[str, Any]] = []
    for run_id, plan in plans:
        if isinstance(plan, StevoraError):
            rows.append({"runId": run_id, "replayId": None, "error": plan.to_dict()})
            continue
        try:
            run, created = await forking.make(ctx.rt, plan, f"{key}:{run_id}" if key else None)
        except StevoraError as exc:  # reported for this run; the others go on
            rows.append({"runId": run_id, "replayId": None, "error": exc.to_dict()})
            continue
        rows.append({"runId": run_id, "replayId": run["id"], "created": created})
    return ok({"count": sum(1 for r in rows if r["replayId"]), "replays": rows}, 201)


@router.get("/replays/compare", responses=errors(400), summary="Replays beside the runs they replay")
async def compare(
    auth: Auth,
    ctx: Ctx,
    runs: Annotated[
        str,
        # At least one id (not only commas and spaces): the schema allows what the route takes.
        Query(description="Replay run ids, comma-separated.", min_length=1, pattern=r"[^,\s]"),
    ],
) -> Response:
    """Per replay: its origin's and its own status, final output, rounds (completed model calls),
    tool calls (the replay's matched / unmatched / live), tokens, cost and latency; `done` once
    every replay has ended."""
    ids = [r for r in (part.strip() for part in runs.split(",")) if r]
    return ok(await bulk.compare(ctx.rt, auth.workspace_id, _run_ids(ids, "runs")))


@router.post("/retries", responses=errors(400), summary="Retry FAILED runs in bulk (dry run first)")
async def retry_failed(
    auth: Auth,
    ctx: Ctx,
    request: Annotated[
        BulkRetryIn,
        Body(examples=[{"definition": "support-agent", "since": "2026-11-20T00:00:00Z", "dryRun": True}]),
    ],
) -> Response:
    """Every FAILED run of `definition` (any version) that failed in [`since`, `until`), or of
    `runIds`, oldest failure first (at most 1000 a call; `truncated` says more are left). With
    `dryRun: true` only the count and the ids. Otherwise each is retried as
    `POST /workflow-runs/{id}/retry`, one by one: a run that cannot be retried is reported in its
    row and the others go on."""
    body = request.model_dump(by_alias=True, exclude_unset=True)
    name, ids = _selection(body)
    since, until = _instant(body, "since"), _instant(body, "until")
    dry_run = body.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise ValidationError.at("dryRun", "must be true or false")
    found, truncated = await bulk.failed_runs(
        ctx.rt, auth.workspace_id, definition_name=name, since=since, until=until, run_ids=ids
    )
    data: dict[str, Any] = {"dryRun": dry_run, "count": len(found), "truncated": truncated}
    if dry_run:
        data["runIds"] = found
        return ok(data)
    results = await bulk.retry_each(ctx.rt, auth.workspace_id, found)
    data["retried"] = sum(1 for r in results if r["outcome"] == "RETRIED")
    data["results"] = results
    return ok(data)


def _instant(body: dict[str, Any], name: str) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ValidationError.at(name, "must be an ISO 8601 date or date-time")
    return parse_instant(value, name)
