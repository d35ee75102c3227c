"""Time travel: a run's fork points, forking a run at one of them, replaying a run (docs/time-travel.md).

Fork points. Before each step visit, and inside an `llm` step before each round's model call. The
state at a point is recovered exactly from the state-change log (`stevora.db.forks`): the run's
initial state, then in order each step visit's tool `update_state`s (by round, commit order,
sequence) and its completion's state change. Before round r of a step only the tool changes of
rounds < r of that visit apply, which is what the run's state was when round r's model call was
made: those tool calls were all committed before it.

Fork. One transaction copies everything before the point into a new run (step runs, completed
model calls, tool traces; `inherited_from` names each origin row, idempotency keys kept) and gives
the run a new step run for the forked step: PENDING for a fork before a step (the driver starts it
as any step), RUNNING with rounds 1..r-1 for a fork at round r, so the llm step resumes exactly as
after a crash (`checkpoints.load_rounds` + `llm_state.rebuild`): round r is its first model call.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.db import definitions as db_definitions
from stevora.db import forks as db_forks
from stevora.db import runs
from stevora.db.outbox import enqueue_webhooks
from stevora.db.reads.rows import DbRow
from stevora.definitions import parse_definition
from stevora.engine import limits
from stevora.engine.hints import dispatch_hint
from stevora.engine.idempotency import check_same_kind, fork_kind
from stevora.engine.steps.llm_recorded import RECORDED, RECORDED_LIVE
from stevora.errors import NotFoundError, ValidationError
from stevora.events import EventType, WebhookEvent
from stevora.ids import new_id
from stevora.observability import tracing
from stevora.templating import render_template

if TYPE_CHECKING:
    from stevora.runtime import Runtime

UNMATCHED = {"error": RECORDED, "live": RECORDED_LIVE}  # a replay's `unmatched` → replay_tools


@dataclass(slots=True)
class ForkPoint:
    step_name: str
    visit: int
    step_index: int
    step_type: str
    round: int | None  # None: before the step
    state: dict[str, Any]
    step_run_ids: list[str]  # the origin's step runs of this visit (all attempts)
    llm_call_id: str | None = None  # the model call made at this point
    tool_call_ids: list[str] = field(default_factory=list)  # the tool calls that model call asked for
    inherited: bool = False  # in a fork: a point before its own fork point

    def to_dict(self) -> dict[str, Any]:
        return {
            "stepName": self.step_name,
            "visit": self.visit,
            "round": self.round,
            "at": self.step_name if self.round is None else f"{self.step_name}:{self.round}",
            "state": self.state,
            "next": {
                "stepRunId": self.step_run_ids[0] if self.step_run_ids else None,
                "llmCallId": self.llm_call_id,
                "toolCallIds": self.tool_call_ids,
            },
            "inherited": self.inherited,
        }


def _merge(state: dict[str, Any], updates: Any) -> None:
    if isinstance(updates, dict):
        state.update(updates)


async def fork_points(
    conn: asyncpg.Connection | asyncpg.Pool, run: DbRow
) -> tuple[list[ForkPoint], dict[str, Any]]:
    """Every point `run` can be forked at, in order, and its history (rows by table)."""
    hist = await db_forks.history(conn, run["id"])
    state: dict[str, Any] = copy.deepcopy(dict(run["initial_state"] or {}))
    edits = run["fork_edits"] or {}
    visits: dict[tuple[str, int], list[DbRow]] = {}
    for s in hist["steps"]:
        visits.setdefault((s["step_name"], s["visit"]), []).append(s)
    calls_by_step: dict[str, list[DbRow]] = {}
    for c in hist["calls"]:
        calls_by_step.setdefault(c["step_run_id"], []).append(c)
    traces_by_step: dict[str, list[DbRow]] = {}
    for t in hist["traces"]:
        traces_by_step.setdefault(t["step_run_id"], []).append(t)
    points: list[ForkPoint] = []
    forked_at = run["forked_at_step"]
    own_point_seen = False
    for (name, visit), attempts in visits.items():
        ids = [a["id"] for a in attempts]
        own = any(a["inherited_from"] is None for a in attempts)
        # A fork's own fork point: its edits of the state apply there (before the point's state).
        at_own_step = forked_at is not None and own and name == forked_at and not own_point_seen
        if at_own_step and run["forked_at_round"] is None:
            _merge(state, edits.get("state"))
            own_point_seen = True
        first = attempts[0]
        points.append(
            ForkPoint(
                name,
                visit,
                first["step_index"],
                first["step_type"],
                None,
                copy.deepcopy(state),
                ids,
                inherited=not own,
            )
        )
        calls = sorted(
            (c for i in ids for c in calls_by_step.get(i, [])), key=lambda c: (c["round"], c["created_at"])
        )
        traces = sorted(
            (t for i in ids for t in traces_by_step.get(i, [])),
            key=lambda t: (t["round"], t["created_at"], t["sequence"]),
        )
        applied = 0
        for c in calls:
            while applied < len(traces) and traces[applied]["round"] < c["round"]:
                _merge(state, traces[applied]["state_updates"])
                applied += 1
            if at_own_step and not own_point_seen and c["round"] == run["forked_at_round"]:
                _merge(state, edits.get("state"))
                own_point_seen = True
            response = c["response"] or {}
            points.append(
                ForkPoint(
                    name,
                    visit,
                    first["step_index"],
                    first["step_type"],
                    c["round"],
                    copy.deepcopy(state),
                    ids,
                    llm_call_id=c["id"],
                    tool_call_ids=[tc["id"] for tc in response.get("toolCalls") or ()],
                    inherited=c["inherited_from"] is not None,
                )
            )
        for t in traces[applied:]:
            _merge(state, t["state_updates"])
        for a in attempts:
            if a["status"] == "COMPLETED":
                _merge(state, a["state_updates"])
    return points, hist


def parse_at(at: Any) -> tuple[str, int | None, int | None]:
    """`{"step": "agent", "round": 3, "visit": 1}` or `"agent:3"` → (step, round, visit)."""
    if isinstance(at, str):
        name, sep, number = at.partition(":")
        if not name or (sep and not number.isdigit()):
            raise ValidationError.at("at", "expected 'STEP' or 'STEP:ROUND'")
        return name, int(number) if sep else None, None
    if not isinstance(at, dict) or not isinstance(at.get("step"), str) or not at["step"]:
        raise ValidationError.at("at.step", "a step name is required")
    rnd, visit = at.get("round"), at.get("visit")
    if rnd is not None and (not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 1):
        raise ValidationError.at("at.round", "must be a positive integer")
    if visit is not None and (not isinstance(visit, int) or isinstance(visit, bool) or visit < 1):
        raise ValidationError.at("at.visit", "must be a positive integer")
    step: str = at["step"]
    return step, rnd, visit


@dataclass(slots=True)
class ForkPlan:
    origin: DbRow
    point: ForkPoint
    points: list[ForkPoint]
    history: dict[str, list[DbRow]]
    state_edits: dict[str, Any]
    tool_results: dict[str, Any]
    model: str | None
    system_prompt: str | None
    replay_tools: str | None = None
    replay: bool = False
    version: DbRow | None = None  # another version of the origin's definition (id, version)
    # A replay under another version starts with that version's first step (name, type, index)
    # instead of the origin's.
    start_step: tuple[str, str, int] | None = None
    edited_step: str | None = None  # the step `model` / `system_prompt` apply to (a replay)

    def edits_json(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if self.state_edits:
            out["state"] = self.state_edits
        if self.tool_results:
            out["toolResults"] = self.tool_results
        if self.model:
            out["model"] = self.model
        if self.system_prompt is not None:
            out["systemPrompt"] = self.system_prompt
        if self.version is not None:
            out["definitionVersion"] = self.version["version"]
        return out or None


async def fork_origin(conn: asyncpg.Connection, workspace_id: str, run_id: str) -> dict[str, Any]:
    """The workspace's run with its fork columns (what `fork_points` reads); NotFoundError else."""
    origin = await db_forks.get_fork_row(conn, workspace_id, run_id)
    full = await runs.get_run_in_workspace(conn, workspace_id, run_id)
    if origin is None or full is None:
        raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
    return {**dict(full), **dict(origin)}


async def plan_fork(
    rt: Runtime, workspace_id: str, run_id: str, at: Any, edits: dict[str, Any] | None
) -> ForkPlan:
    """Check a fork request against the run's fork points: nothing is written. 400 naming the field."""
    edits = edits or {}
    if not isinstance(edits, dict):
        raise ValidationError.at("edits", "must be an object")
    unknown = sorted(set(edits) - {"state", "toolResults", "model", "systemPrompt", "definitionVersion"})
    if unknown:
        raise ValidationError.at(
            f"edits.{unknown[0]}", "unknown edit (state, toolResults, model, systemPrompt, definitionVersion)"
        )
    step_name, rnd, visit = parse_at(at)
    async with rt.pool.acquire() as conn:
        origin = await fork_origin(conn, workspace_id, run_id)
        points, hist = await fork_points(conn, origin)
    candidates = [
        p
        for p in points
        if p.step_name == step_name and p.round == rnd and (visit is None or p.visit == visit)
    ]
    if not candidates:
        where = (
            f"step '{step_name}'"
            + (f" round {rnd}" if rnd is not None else "")
            + (f" visit {visit}" if visit else "")
        )
        raise ValidationError.at(
            "at", f"run {run_id} has no fork point at {where} (GET .../checkpoints lists them)"
        )
    point = candidates[0]  # the first visit unless one is named
    state_edits = edits.get("state") or {}
    if not isinstance(state_edits, dict):
        raise ValidationError.at("edits.state", "must be an object of top-level state keys")
    tool_results = edits.get("toolResults") or {}
    if not isinstance(tool_results, dict):
        raise ValidationError.at("edits.toolResults", "must be an object: tool call id → result")
    if tool_results:
        if point.round is None:
            raise ValidationError.at(
                "edits.toolResults", "tool results can only be replaced for a fork at a round"
            )
        prev = previous_round_calls(point, hist)
        ids = {tc["id"] for c in prev for tc in (c["response"] or {}).get("toolCalls") or ()}
        for call_id in tool_results:
            if call_id not in ids:
                raise ValidationError.at(
                    f"edits.toolResults.{call_id}",
                    f"not a tool call of round {point.round - 1} of step '{step_name}' "
                    f"(its calls: {', '.join(sorted(ids)) or 'none'})",
                )
    # What the edits carry is stored as sent (the fork's state, tool traces, definition): checked
    # here as every stored value is, whichever way the request came in (API, web UI form).
    for name in ("state", "toolResults", "systemPrompt"):
        if edits.get(name) is not None:
            limits.check_value(rt.settings, edits[name], f"edits.{name}")
    model = edits.get("model")
    system_prompt = edits.get("systemPrompt")
    if model is not None or system_prompt is not None:
        if point.step_type != "llm":
            raise ValidationError.at(
                "edits.model" if model is not None else "edits.systemPrompt",
                f"step '{step_name}' is not an llm step",
            )
    _check_model_and_prompt(rt, model, system_prompt, "edits.")
    plan = ForkPlan(origin, point, points, hist, state_edits, tool_results, model, system_prompt)
    if edits.get("definitionVersion") is not None:
        plan.version = await _other_version(rt, workspace_id, origin, point, edits["definitionVersion"])
    return plan


def previous_round_calls(point: ForkPoint, hist: dict[str, list[DbRow]]) -> list[DbRow]:
    """The model calls of the round before a fork point at a round: the calls whose tool results
    a fork may replace (none for a point before a step)."""
    if point.round is None:
        return []
    previous = point.round - 1
    return [c for c in hist["calls"] if c["step_run_id"] in point.step_run_ids and c["round"] == previous]


def _check_model_and_prompt(rt: Runtime, model: Any, system_prompt: Any, prefix: str) -> None:
    """A model with a configured provider and a string system prompt; 400 naming `prefix`+field."""
    if model is not None:
        if not isinstance(model, str) or not model:
            raise ValidationError.at(f"{prefix}model", "must be a model name")
        if rt.providers.resolve(model) is None:
            raise ValidationError.at(f"{prefix}model", f"no provider is configured for model '{model}'")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValidationError.at(f"{prefix}systemPrompt", "must be a string")


async def _other_version(
    rt: Runtime, workspace_id: str, origin: dict[str, Any], point: ForkPoint, version: Any
) -> DbRow:
    """The origin's definition at `version`, checked to run the forked step where the origin ran
    it: the same name, type and position (the fork's step run keeps its position)."""
    path = "edits.definitionVersion"
    if not isinstance(version, str) or not version:
        raise ValidationError.at(path, "must be a version of the run's definition")
    async with rt.pool.acquire() as conn:
        name = await db_definitions.name_of(conn, origin["definition_id"])
        row: DbRow | None = await db_definitions.find_version(conn, workspace_id, name or "", version)
    if row is None:
        raise ValidationError.at(path, f"definition '{name}' has no version '{version}'")
    spec = await rt.definitions.get(row["id"])
    try:
        index = spec.index_of(point.step_name)
    except KeyError:
        raise ValidationError.at(path, f"version '{version}' has no step '{point.step_name}'") from None
    step = spec.steps[index]
    if step.type != point.step_type or index != point.step_index:
        raise ValidationError.at(
            path,
            f"step '{point.step_name}' is a {step.type} step at position {index + 1} in version '{version}', "
            f"a {point.step_type} step at position {point.step_index + 1} in the run's",
        )
    return row


def derived_definition(
    spec_dump: dict[str, Any], plan: ForkPlan, step_name: str | None = None
) -> dict[str, Any] | None:
    """The origin's definition with the step's (default: the forked step's) model / system prompt
    replaced; None when neither is edited."""
    if plan.model is None and plan.system_prompt is None:
        return None
    data = copy.deepcopy(spec_dump)
    for step in data["steps"]:
        if step["name"] == (step_name or plan.point.step_name):
            if plan.model is not None:
                step["model"] = plan.model
                step.pop("provider", None)
                step.pop("fallbackModels", None)
            if plan.system_prompt is not None:
                step["systemPrompt"] = plan.system_prompt
    data.pop("version", None)
    return data


async def plan_replay(
    rt: Runtime,
    workspace_id: str,
    run_id: str,
    *,
    model: str | None = None,
    system_prompt: str | None = None,
    step: str | None = None,
    definition_version: str | None = None,
    unmatched: str = "error",
) -> ForkPlan:
    """Check a replay request: the run driven again from its first step, tool calls answered from
    its recording (unmatched ones fail, or run live with `unmatched="live"`), optionally under
    another version of its definition and with another model / system prompt for `step` (default:
    the first llm step). Nothing is written; 400 naming the field."""
    if unmatched not in UNMATCHED:
        raise ValidationError.at("unmatched", "must be 'error' (the default) or 'live'")
    async with rt.pool.acquire() as conn:
        run = await db_forks.get_fork_row(conn, workspace_id, run_id)
        if run is None:
            raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
        target = None
        if definition_version is not None:
            if not isinstance(definition_version, str) or not definition_version:
                raise ValidationError.at("definitionVersion", "must be a version of the run's definition")
            name = await db_definitions.name_of(conn, run["definition_id"])
            target = await db_definitions.find_version(conn, workspace_id, name or "", definition_version)
            if target is None:
                raise ValidationError.at(
                    "definitionVersion", f"definition '{name}' has no version '{definition_version}'"
                )
        points, _ = await fork_points(conn, run)
    if not points:
        raise ValidationError.at("runId", "the run has not started a step")
    plan = await plan_fork(rt, workspace_id, run_id, {"step": points[0].step_name}, {})
    plan.replay, plan.replay_tools = True, UNMATCHED[unmatched]
    spec = await rt.definitions.get(target["id"] if target is not None else run["definition_id"])
    if target is not None:
        first = spec.steps[0]
        plan.version, plan.start_step = target, (first.name, first.type, 0)
    if model is None and system_prompt is None:
        return plan
    field_name = "model" if model is not None else "systemPrompt"
    llm_steps = [s.name for s in spec.steps if s.type == "llm"]
    if step is not None and step not in llm_steps:
        raise ValidationError.at("step", f"'{step}' is not an llm step of the replayed definition")
    target_step = step or (llm_steps[0] if llm_steps else None)
    if target_step is None:
        raise ValidationError.at(field_name, "the replayed definition has no llm step")
    _check_model_and_prompt(rt, model, system_prompt, "")
    if system_prompt is not None:
        limits.check_value(rt.settings, system_prompt, "systemPrompt")
    plan.model, plan.system_prompt, plan.edited_step = model, system_prompt, target_step
    return plan


async def fork_definition_id(rt: Runtime, plan: ForkPlan, edited_step: str | None = None) -> str:
    """The definition the fork runs: the origin's (or the version the edits name), or with a model /
    system prompt edit a derived version of it (`<version>+fork-<digest>`), stored once per content."""
    definition_id: str = plan.version["id"] if plan.version is not None else plan.origin["definition_id"]
    spec = await rt.definitions.get(definition_id)
    dump = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    derived = derived_definition(dump, plan, edited_step)
    if derived is None:
        return definition_id
    digest = hashlib.sha256(json.dumps(derived, sort_keys=True).encode()).hexdigest()[:12]
    derived["version"] = f"{spec.version}+fork-{digest}"[:50]
    checked = parse_definition(derived).model_dump(by_alias=True, exclude_none=True, mode="json")
    return await db_forks.store_definition_version(
        rt.pool, definition_id, derived["version"], checked["steps"]
    )


async def make(rt: Runtime, plan: ForkPlan, idempotency_key: str | None) -> tuple[DbRow, bool]:
    """The fork or replay `plan` describes, under its definition (`fork_definition_id`); (run
    row, created)."""
    definition_id = await fork_definition_id(rt, plan, plan.edited_step)
    return await create_fork(rt, plan, definition_id, idempotency_key)


async def create_fork(
    rt: Runtime, plan: ForkPlan, definition_id: str, idempotency_key: str | None
) -> tuple[DbRow, bool]:
    """Write the fork in one transaction; (run row, created). With a taken idempotency key, the
    existing run and False. The new run's trace starts at a `fork_run` span linked to the origin's."""
    origin = plan.origin
    state = {**plan.point.state, **plan.state_edits}
    copying = plan_copy(plan)  # decided before the transaction: it only writes
    with tracing.run_forked(origin["workspace_id"], origin["id"], origin.get("trace_context")) as trace:
        fork, created = await _write_fork(
            rt, plan, copying, definition_id, idempotency_key, state, trace.carrier
        )
        trace.created(fork["id"])
    if created:
        await dispatch_hint(rt.dispatcher, fork["id"])
    return fork, created


@dataclass(frozen=True, slots=True)
class ForkCopy:
    """What a fork copies from its origin, decided from the plan's history alone (no reads, no
    writes): the rows to copy, with their new ids and edits, keyed by their origin step runs
    (whose copies get their ids as they are written)."""

    inherited_visits: int  # step visits before the fork point, copied whole
    inherited_steps: tuple[DbRow, ...]  # their step runs (every attempt)
    own_step: Mapping[str, Any]  # what the fork's own step run for the forked step copies
    own_status: str  # PENDING before a step, RUNNING at a round
    own_step_run_ids: tuple[str, ...]  # the origin's step runs the own step run stands for
    calls: tuple[dict[str, Any], ...]  # model calls: new id, origin step run id, inherited_from
    traces: tuple[dict[str, Any], ...]  # tool traces, likewise (replaced results applied)
    totals: tuple[float, int, int]  # cost in cents, input and output tokens of what is copied
    start_step: str  # the run's current step name


def plan_copy(plan: ForkPlan) -> ForkCopy:
    """Decide everything `_write_fork` copies (see `ForkCopy`)."""
    point, hist = plan.point, plan.history
    point_idx = next(i for i, p in enumerate(plan.points) if p is point)
    before_visits = {(p.step_name, p.visit) for p in plan.points[:point_idx] if p.round is None}
    before_visits.discard((point.step_name, point.visit))
    calls_before = [
        c
        for c in hist["calls"]
        if c["step_run_id"] in point.step_run_ids and point.round is not None and c["round"] < point.round
    ]
    totals = (
        sum(c["cost_usd"] for c in hist["calls"] if _before(c, hist, before_visits)) * 100
        + sum(c["cost_usd"] for c in calls_before) * 100,
        sum(c["input_tokens"] for c in hist["calls"] if _before(c, hist, before_visits))
        + sum(c["input_tokens"] for c in calls_before),
        sum(c["output_tokens"] for c in hist["calls"] if _before(c, hist, before_visits))
        + sum(c["output_tokens"] for c in calls_before),
    )
    inherited = tuple(s for s in hist["steps"] if (s["step_name"], s["visit"]) in before_visits)
    own_step: Mapping[str, Any] = next(s for s in hist["steps"] if s["id"] == point.step_run_ids[0])
    if plan.start_step is not None:
        name, kind, index = plan.start_step
        own_step = {"step_name": name, "step_type": kind, "step_index": index, "visit": 1}
    copied_steps = {s["id"] for s in inherited} | set(point.step_run_ids)
    copied_calls = [
        c
        for c in hist["calls"]
        if c["step_run_id"] in copied_steps
        and (c["step_run_id"] not in point.step_run_ids or c in calls_before)
    ]
    call_ids = {c["id"]: new_id("llm") for c in copied_calls}
    first_round = min((c["round"] for c in calls_before), default=None)
    new_calls = []
    for c in copied_calls:
        row = {**dict(c), "id": call_ids[c["id"]], "inherited_from": c["id"]}
        if plan.system_prompt is not None and c in calls_before and c["round"] == first_round:
            row["request"] = _with_system_prompt(c["request"], plan.system_prompt, plan.origin, point)
        new_calls.append(row)
    last_round = point.round - 1 if point.round is not None else None
    new_traces = []
    for t in hist["traces"]:
        if t["step_run_id"] not in copied_steps:
            continue
        if t["llm_call_id"] is not None and t["llm_call_id"] not in call_ids:
            continue  # a round at or after the fork point
        row = {
            **dict(t),
            "id": new_id("tt"),
            "llm_call_id": call_ids.get(t["llm_call_id"]) if t["llm_call_id"] else None,
            "inherited_from": t["id"],
        }
        if (
            t["step_run_id"] in point.step_run_ids
            and t["round"] == last_round
            and t["tool_call_id"] in plan.tool_results
        ):
            row.update(
                output_json=plan.tool_results[t["tool_call_id"]],
                status="completed",
                error=None,
                error_code=None,
                result_text=None,
            )
        new_traces.append(row)
    return ForkCopy(
        inherited_visits=len(before_visits),
        inherited_steps=inherited,
        own_step=own_step,
        own_status="PENDING" if point.round is None else "RUNNING",
        own_step_run_ids=tuple(point.step_run_ids),
        calls=tuple(new_calls),
        traces=tuple(new_traces),
        totals=totals,
        start_step=plan.start_step[0] if plan.start_step else point.step_name,
    )


async def _write_fork(
    rt: Runtime,
    plan: ForkPlan,
    copying: ForkCopy,
    definition_id: str,
    idempotency_key: str | None,
    state: dict[str, Any],
    trace_context: dict[str, str] | None,
) -> tuple[DbRow, bool]:
    """Write what `copying` says, in one transaction: the run, its step runs, model calls and
    tool traces, its events and webhook."""
    origin, point = plan.origin, plan.point
    async with rt.pool.acquire() as conn, conn.transaction():
        fork = await db_forks.insert_fork_run(
            conn,
            origin=origin,
            definition_id=definition_id,
            state=state,
            initial_state=dict(origin["initial_state"] or {}),
            step_name=copying.start_step,
            round_=point.round,
            edits=plan.edits_json(),
            idempotency_key=idempotency_key,
            replay_tools=plan.replay_tools,
            replay=plan.replay,
            totals=copying.totals,
            trace_context=trace_context,
        )
        if fork is None:
            key = idempotency_key or ""
            existing = await db_forks.get_by_key(conn, origin["workspace_id"], key)
            assert existing is not None
            check_same_kind(existing, fork_kind(origin["id"], replay=plan.replay), key)
            return existing, False
        step_ids: dict[str, str] = {}
        for s in copying.inherited_steps:
            step_ids[s["id"]] = await db_forks.copy_step_run(conn, fork["id"], s)
        own = await db_forks.copy_step_run(conn, fork["id"], copying.own_step, status=copying.own_status)
        for i in copying.own_step_run_ids:
            step_ids[i] = own
        await db_forks.copy_llm_calls(
            conn, fork["id"], [{**c, "step_run_id": step_ids[c["step_run_id"]]} for c in copying.calls]
        )
        rt.faults.reached("fork_writing")  # the run and its model calls written, not committed
        await db_forks.copy_traces(
            conn, fork["id"], [{**t, "step_run_id": step_ids[t["step_run_id"]]} for t in copying.traces]
        )
        await db_forks.set_current_step(conn, fork["id"], own)
        forked_from = {"runId": origin["id"], "stepName": point.step_name, "round": point.round}
        await db_forks.append_event(
            conn,
            fork["id"],
            EventType.WORKFLOW_FORKED,
            {
                "forkedFrom": forked_from,
                "replayOf": origin["id"] if plan.replay else None,
                "inheritedSteps": copying.inherited_visits,
                "inheritedModelCalls": len(copying.calls),
                "inheritedToolCalls": len(copying.traces),
                "edits": plan.edits_json(),
            },
        )
        await db_forks.append_event(
            conn,
            origin["id"],
            EventType.WORKFLOW_FORKED,
            {
                "forkRunId": fork["id"],
                "stepName": point.step_name,
                "round": point.round,
                "replay": plan.replay,
            },
        )
        await enqueue_webhooks(
            conn,
            origin["workspace_id"],
            WebhookEvent.WORKFLOW_FORKED,
            {
                "workflowRunId": fork["id"],
                "status": fork["status"],
                "forkedFrom": forked_from,
                "replayOf": origin["id"] if plan.replay else None,
                "edits": plan.edits_json(),
            },
        )
    return fork, True


def _before(c: DbRow, hist: dict[str, list[DbRow]], visits: set[tuple[str, int]]) -> bool:
    step = next((s for s in hist["steps"] if s["id"] == c["step_run_id"]), None)
    return step is not None and (step["step_name"], step["visit"]) in visits


def _with_system_prompt(
    request: dict[str, Any], prompt: str, origin: Any, point: ForkPoint
) -> dict[str, Any]:
    """The first round's stored request with its system message replaced (or added)."""
    text = render_template(prompt, input=origin["input"] or {}, state=point.state)
    messages = [m for m in request.get("messages") or () if m.get("role") != "system"]
    # A thread turn's history (stored as a reference) goes right after the one system message.
    at = {"historyAt": 1} if "historyFrom" in request else {}
    return {**request, "messages": [{"role": "system", "content": text}, *messages], **at}


def fork_view(row: Any) -> dict[str, Any]:
    return (
        {
            "runId": row["forked_from_run_id"],
            "stepName": row["forked_at_step"],
            "round": row["forked_at_round"],
        }
        if row["forked_from_run_id"]
        else {}
    )
