"""`map`: runs a workflow once per item of a list, as child runs, at most `concurrency` at a time.

    {"type": "map", "name": "triage", "items": "{{input.tickets}}", "workflow": "triage-ticket",
     "input": {"ticket": "{{item}}", "n": "{{index}}"}, "concurrency": 8,
     "onItemFailure": "fail", "outputKey": "results"}

* Execute: resolve `items` (a list, at most `STEVORA_MAP_MAX_ITEMS`), find the workflow, render
  each item's child input (`{{item}}`, `{{index}}`); any problem fails the step naming the path
  or the item. Nothing is written: the step goes WAITING with the plan.
* Going WAITING (`on_waiting`, in the driver's transaction, under the parent's row lock): one
  `map_steps` row and one `map_items` row per index, then the first `concurrency` child runs,
  dispatched after commit. The parent holds no lease, task or thread while they run.
* Answered: each child's ending ends its item in the child's own terminal statement, waiting for
  no sibling and taking no lock of the parent (migration 0028: a trigger on the child run going
  COMPLETED or FAILED; `answer_from_child` for a child cancelled on its own): the item's result,
  and its slot passed on to the next pending item (a PENDING child run). After the commit, the
  worker that ended it records the endings of the parent's maps in a batch
  (`stevora.engine.map_recorder`, at most one recording in flight per parent per process): under
  the parent's row lock, the counts, the `MAP_ITEM_*` events and, when every item has ended or an
  item failed with `onItemFailure: "fail"`, the parent's wait made due; then it dispatches the
  children started and the due parent. An ending nobody recorded is recorded by the sweep or by
  `on_due`.
* Due (`on_due`, in the parent's worker): first record what nobody recorded, then collect. All
  ended → the step completes with the results in item order in `state[outputKey]`; a failed item
  with `fail` → the step fails naming the first failed index (running siblings run to their end
  and keep their results for a retry; items not started are not started). Otherwise (a safety
  re-check every `RECHECK`), under the map's and then the parent's row lock: record and look
  again (a recording that committed since made the wait due and its dispatch of the parent,
  leased by this worker, was dropped: collect now), else start what has a free slot and wait on.
  The children its recordings and starts create are dispatched as soon as the driver's
  transaction ends (`map_recorder.dispatch_after_commit`), not left to the sweep.
* Retry: a new step run of a map whose last step run FAILED takes over the items that completed
  (their results) or still run (their child run), so only the failed items run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.clock import utcnow
from stevora.db import definitions as db_definitions
from stevora.db import map_items as db_map
from stevora.db import runs
from stevora.db.map_items import NewMap
from stevora.db.reads.rows import DbRow
from stevora.definitions import MapStep
from stevora.engine import budget as budget_rules
from stevora.engine import limits, map_recorder
from stevora.engine.steps.awaited.workflow import nesting_problem
from stevora.engine.steps.base import StepExecution, StepType, WaitContext, WaitPlan
from stevora.errors import StevoraError
from stevora.events import Event, EventType, step_completed
from stevora.statuses import MapItemStatus, PauseReason, ResumeReason, RunStatus, StepStatus
from stevora.tasks import StepResult
from stevora.templating import MissingTemplatePath, render_typed
from stevora.tools import schema_problems, with_defaults

if TYPE_CHECKING:
    from stevora.runtime import Runtime

# A waiting map is re-checked this often even if no child's ending reaches it (a safety net: a
# child's ending normally starts the next items and makes the wait due when all have ended).
RECHECK = timedelta(minutes=5)
_ENDED = (MapItemStatus.COMPLETED, MapItemStatus.FAILED, MapItemStatus.CANCELLED)


def _failed(code: str, message: str, retryable: bool = False, **details: Any) -> StepResult:
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return StepResult(status="failed", error=error, retryable=retryable)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What `execute` resolved, for `on_waiting` to write."""

    definition_id: str
    budget: dict[str, Any] | None
    inputs: list[Any]


class MapStepType(StepType):
    name = "map"
    waits_for = "child run"

    async def execute(self, rt: Runtime, ex: StepExecution, step: MapStep) -> StepResult:
        steps = await runs.completed_step_outputs(rt.pool, ex.run_id)
        try:
            items = render_typed(step.items, input=ex.input, state=ex.state, steps=steps, field="items")
        except MissingTemplatePath as exc:
            return _failed("MAP_ITEMS_MISSING", str(exc), path="items")
        if not isinstance(items, list):
            what = "null" if items is None else type(items).__name__
            return _failed(
                "MAP_ITEMS_NOT_A_LIST", f"items: '{step.items}' resolved to {what}, not a list", path="items"
            )
        if len(items) > rt.settings.map_max_items:
            return _failed(
                "MAP_TOO_MANY_ITEMS",
                f"items: {len(items)} items, more than STEVORA_MAP_MAX_ITEMS ({rt.settings.map_max_items})",
                path="items",
            )
        key = step.effective_output_key()
        if not items:  # nothing to fan out over: done, without looking the workflow up
            return StepResult(output={"total": 0, "completed": 0, "failed": 0}, state_updates={key: []})
        row = await db_definitions.find_version(rt.pool, ex.workspace_id, step.workflow, step.version)
        if row is None:
            what = f"'{step.workflow}'" + (f" version '{step.version}'" if step.version else "")
            return _failed("WORKFLOW_NOT_FOUND", f"workflow: Workflow {what} does not exist", path="workflow")
        problem = await _nesting_problem(rt, ex.run_id, step.workflow)
        if problem is not None:
            return problem
        schema = db_definitions.workflow_input_schema(row)
        inputs: list[Any] = []
        for index, item in enumerate(items):
            try:
                child_input = render_typed(
                    step.input,
                    input=ex.input,
                    state=ex.state,
                    steps=steps,
                    scope={"item": item, "index": index},
                )
            except MissingTemplatePath as exc:
                return _failed("TEMPLATE_PATH_MISSING", f"items[{index}]: {exc}", path=f"items[{index}]")
            if schema is not None:
                child_input = with_defaults(schema, child_input)
                problems = schema_problems(schema, child_input)
                if problems:
                    return _failed(
                        "INVALID_ARGUMENTS",
                        f"items[{index}]: input for workflow '{step.workflow}': {'; '.join(problems)}",
                        path=f"items[{index}]",
                    )
            inputs.append(child_input)
        carried = _carried(
            await db_map.retried_items(rt.pool, ex.run_id, ex.step_name, ex.step_run_id), inputs
        )
        if len(carried) == len(inputs) and all(r["status"] == MapItemStatus.COMPLETED for r in carried):
            return _collected(step, carried)  # a retry whose failed items are all gone already
        budget = budget_rules.resolve(rt.settings, (await rt.definitions.get(row["id"])).budget)
        return StepResult(
            status="waiting",
            wait_until=utcnow() + RECHECK,
            pause_reason=PauseReason.MAP,
            pause_details={
                "map": {"workflow": step.workflow, "total": len(inputs), "concurrency": step.concurrency}
            },
            awaiting=[_Plan(row["id"], budget, inputs)],
        )

    async def on_waiting(self, wait: WaitContext, result: StepResult) -> WaitPlan:
        assert result.awaiting, "a waiting map step carries its plan"
        plan: _Plan = result.awaiting[0]
        step: MapStep = wait.step
        conn, step_run = wait.conn, wait.step_run
        # Under the parent's row lock, a child run this map takes over from the step run it
        # retries either ended before (its result is read here) or waits until this commits.
        parent = await runs.lock_run(conn, wait.run["id"])
        assert parent is not None
        carried = _carried(
            await db_map.retried_items(conn, parent["id"], step_run["step_name"], step_run["id"]), plan.inputs
        )
        new = NewMap(
            step_run_id=step_run["id"],
            run_id=parent["id"],
            step_name=step_run["step_name"],
            child_definition_id=plan.definition_id,
            child_budget=plan.budget,
            concurrency=step.concurrency,
            on_item_failure=step.on_item_failure,
            inputs=plan.inputs,
        )
        await db_map.insert_map(conn, new, carried)
        header = await db_map.get_map(conn, step_run["id"])
        assert header is not None
        started = await db_map.start_pending(conn, parent, header, header["concurrency"] - header["running"])
        progress = _progress(header, started=len(started))
        events = [_started_event(step_run, row, progress) for row in started]
        return WaitPlan(
            events=tuple(events),
            pause_details={"map": {**progress, "workflow": step.workflow, "concurrency": step.concurrency}},
            dispatch=tuple(row["child_run_id"] for row in started),
        )

    async def on_due(self, wait: WaitContext) -> StepResult | None:
        conn, step_run, step, run_id = wait.conn, wait.step_run, wait.step, wait.run["id"]
        # Endings no worker recorded (it died after their commit) are recorded first, under the
        # parent's lock; the children that starts are dispatched once this commits.
        woken = await db_map.record_endings(conn, run_id)
        header = await db_map.get_map(conn, step_run["id"])
        if header is None:  # cannot happen: the map is written with the wait
            return _failed("MAP_LOST", f"Map step '{step_run['step_name']}' has no items recorded")
        rows = await db_map.items(conn, step_run["id"])
        ready = _ready(header, rows)
        if not ready:
            # Not done: the safety re-check. Under the map's row lock, then the parent's (a
            # recording's order), record and look again: a recording that committed since the
            # look above made the wait due, and its dispatch of the parent was dropped (the parent
            # is ours), so pushing the wait out now would delay a done map by `RECHECK`.
            await db_map.lock_map(conn, step_run["id"])
            run = await runs.lock_run(conn, run_id)
            assert run is not None
            woken += await db_map.record_endings(conn, run_id)
            header = await db_map.get_map(conn, step_run["id"])
            assert header is not None
            rows = await db_map.items(conn, step_run["id"])
            ready = _ready(header, rows)
            if not ready:  # start what has a free slot, and wait on
                started = await db_map.start_pending(
                    conn, run, header, header["concurrency"] - header["running"]
                )
                until = utcnow() + RECHECK
                await runs.update_step(
                    conn, step_run["id"], expect=[StepStatus.WAITING], sets={"wait_until": until}
                )
                progress = _progress(header, started=len(started))
                await runs.update_run(
                    conn,
                    run_id,
                    expect=[RunStatus.WAITING],
                    owner=wait.owner,
                    sets={"next_run_at": until},
                    events=[_started_event(step_run, row, progress) for row in started],
                )
                woken += [row["child_run_id"] for row in started]
        map_recorder.dispatch_after_commit(wait.rt, run_id, [r for r in woken if r != run_id])
        if not ready:
            return None
        failed = _failed_items(rows)
        if failed and header["on_item_failure"] == "fail":
            return _item_failed(header, failed[0])
        wait.rt.faults.reached("map_collecting")
        return await self._complete(wait, header, step, rows)

    async def _complete(
        self, wait: WaitContext, header: DbRow, step: MapStep, rows: list[DbRow]
    ) -> StepResult | None:
        """Complete the step with the results, and the run back to RUNNING with them merged into
        its state (what the driver's due path does not do: a due wait has no state updates)."""
        result = limits.checked_result(wait.rt.settings, wait.run["state"] or {}, _collected(step, rows))
        if result.status != "completed":
            return result
        try:
            limits.check_state_merge(wait.rt.settings, wait.run["state"], result.state_updates)
        except StevoraError as exc:
            return StepResult(status="failed", error=exc.to_dict(), retryable=False)
        done = await runs.update_step(
            wait.conn,
            wait.step_run["id"],
            expect=[StepStatus.WAITING],
            sets={
                "status": StepStatus.COMPLETED,
                "output": result.output,
                "state_updates": result.state_updates,
                "wait_until": None,
            },
            now_columns=["completed_at"],
        )
        await runs.update_run(
            wait.conn,
            wait.run["id"],
            expect=[RunStatus.WAITING, RunStatus.RUNNING],
            owner=wait.owner,
            sets={"status": RunStatus.RUNNING, "next_run_at": None},
            merge_state=result.state_updates,
            events=[
                step_completed(done),
                Event(
                    EventType.WORKFLOW_RESUMED,
                    {"reason": ResumeReason.MAP, "stepName": done["step_name"], **_progress(header)},
                    done["id"],
                ),
            ],
        )
        return None


async def _nesting_problem(rt: Runtime, run_id: str, workflow: str) -> StepResult | None:
    nesting = await nesting_problem(rt, run_id, workflow)
    if nesting is None:
        return None
    if nesting.code == "WORKFLOW_RECURSION":
        message = f"workflow: '{workflow}' is already running above this map ({nesting.path})"
    else:
        message = f"workflow: mapping over '{workflow}' would nest runs {nesting.depth} deep (limit {nesting.limit})"
    return _failed(nesting.code, message, path="workflow")


def _carried(rows: list[DbRow], inputs: list[Any]) -> list[DbRow]:
    """Items of a failed map to take over: completed or still running, for the same input."""

    def same(a: Any, b: Any) -> bool:
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

    return [
        r
        for r in rows
        if r["status"] in (MapItemStatus.COMPLETED, MapItemStatus.RUNNING)
        and r["item_index"] < len(inputs)
        and same(r["input"], inputs[r["item_index"]])
    ]


def _collected(step: MapStep, rows: list[DbRow]) -> StepResult:
    """The completed step's result: outputs in item order (`fail`), or for `continue` each item's
    `{index, status, output, error, childRunId}`."""
    completed = sum(1 for r in rows if r["status"] == MapItemStatus.COMPLETED)
    if step.on_item_failure == "continue":
        results: list[Any] = [
            {
                "index": r["item_index"],
                "status": r["status"].upper(),
                "output": r["output"],
                "error": r["error"],
                "childRunId": r["child_run_id"],
            }
            for r in rows
        ]
    else:
        results = [r["output"] for r in rows]
    output = {"total": len(rows), "completed": completed, "failed": len(rows) - completed}
    return StepResult(output=output, state_updates={step.effective_output_key(): results})


def _ready(header: DbRow, rows: list[DbRow]) -> bool:
    """Whether the map is done: every item's ending recorded, or (`fail`) a failed one recorded.
    An ending committed but not recorded yet is not counted (its recording writes its event and
    makes the wait due again)."""
    recorded = [r for r in rows if r["status"] in _ENDED and not r["unrecorded"]]
    return len(recorded) == len(rows) or (
        header["on_item_failure"] == "fail" and bool(_failed_items(recorded))
    )


def _failed_items(rows: list[DbRow]) -> list[DbRow]:
    """The failed (or cancelled) items whose ending is recorded, in index order."""
    return [
        r
        for r in rows
        if r["status"] in (MapItemStatus.FAILED, MapItemStatus.CANCELLED) and not r["unrecorded"]
    ]


def _item_failed(header: DbRow, item: DbRow) -> StepResult:
    error = item["error"] or {}
    message = (
        f"Item {item['item_index']} of {header['total']} failed: child run {item['child_run_id']} "
        f"{item['status'].upper()}: {error.get('code') or 'ERROR'}: {error.get('message') or ''}"
    ).rstrip(": ")
    # Retryable: a map step given a `retry` policy runs its failed items again.
    return _failed(
        "MAP_ITEM_FAILED",
        message,
        retryable=True,
        itemIndex=item["item_index"],
        childRunId=item["child_run_id"],
        path=f"items[{item['item_index']}]",
    )


def _progress(header: DbRow, *, started: int = 0) -> dict[str, int]:
    return {
        "total": header["total"],
        "done": header["completed"] + header["failed"],
        "running": header["running"] + started,
        "failed": header["failed"],
    }


def _started_event(step_run: DbRow, row: DbRow, progress: dict[str, int]) -> Event:
    return Event(
        EventType.MAP_ITEM_STARTED,
        {
            "stepName": step_run["step_name"],
            "index": row["item_index"],
            "childRunId": row["child_run_id"],
            **progress,
        },
        step_run["id"],
    )


async def record_cancelled_with_parent(conn: asyncpg.Connection, child: DbRow) -> None:
    """A child run cancelled because its parent is: its item ends `cancelled` (and stops counting
    as running), with no slot filled, since the parent is ending in the same transaction."""
    await db_map.record_child_end(
        conn,
        child["id"],
        MapItemStatus.CANCELLED,
        None,
        {"code": "CHILD_RUN_CANCELLED", "message": "Run was cancelled with its parent"},
    )


async def answer_from_child(conn: asyncpg.Connection, child: DbRow) -> list[str]:
    """Called in the terminal transaction of a run with a parent and no tool call, when that
    transaction does more than the run's own statement. A child going COMPLETED or FAILED has ended
    its item already, in its own statement (the `map_child_ended` trigger, migration 0028); a child
    cancelled on its own ends it here, the same way (`map_items.end_item`: its result, and its slot
    passed on to the next pending item, waiting for no sibling and taking no parent lock).
    Recording the ending on the parent (counts, events, the parent's wake) is done after the commit
    (`stevora.engine.map_recorder`), which also dispatches the item started. Returns nothing to
    dispatch. Idempotent: an item is written once."""
    if child["status"] != RunStatus.CANCELLED:
        return []
    error = {"code": "CHILD_RUN_CANCELLED", "message": "Run was cancelled", **(child["error"] or {})}
    await db_map.end_item(conn, child, MapItemStatus.CANCELLED, None, error)
    return []
