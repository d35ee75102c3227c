"""Workflows called as tools: each call starts a child run, and the child's ending answers it.

* Handed over: the child run is created in the transaction that makes the parent's step WAITING
  (once per call: a replayed round finds its awaited row and creates nothing), and dispatched
  after commit.
* Due: a workflow call has no deadline of its own.
* Answered: when the child ends (`stevora.engine.endings` calls `answer_from_child` in the child's
  terminal transaction), or by the recovery sweep (`answer_finished_children`) when the parent was
  not WAITING yet at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import asyncpg

from stevora.db import awaited as db_awaited
from stevora.db import definitions as db_definitions
from stevora.db import runs
from stevora.db.awaited import NewAwaitedCall
from stevora.db.definitions import find_version, workflow_input_schema
from stevora.db.reads.rows import DbRow
from stevora.definitions import ToolRef, WorkflowToolDef
from stevora.engine import budget as budget_rules
from stevora.engine.steps.awaited import Answer, answer
from stevora.engine.steps.awaited.kind import CallKind, HandingOver, Offered, ToolEntry
from stevora.engine.steps.base import WaitContext, WaitPlan
from stevora.engine.steps.tool_calls import failed_call
from stevora.llm.messages import ToolSpec
from stevora.observability import tracing
from stevora.statuses import AnsweredBy, AwaitedKind, AwaitedStatus, PauseReason, ResumeReason, RunStatus
from stevora.tools import ToolOutcome, schema_problems, with_defaults

if TYPE_CHECKING:
    from stevora.runtime import Runtime


@dataclass(frozen=True, slots=True)
class NestingProblem:
    """Why a run may not start `workflow` as a child (a workflow tool's call, a map's items)."""

    code: Literal["WORKFLOW_RECURSION", "WORKFLOW_DEPTH_EXCEEDED"]
    path: str  # the workflows from the root down to the child, "a → b → a"
    depth: int  # how deep the child would nest
    limit: int  # STEVORA_MAX_WORKFLOW_DEPTH


async def nesting_problem(rt: Runtime, run_id: str, workflow: str) -> NestingProblem | None:
    """A child run of `workflow` under `run_id` would run a workflow already running above it, or
    nest deeper than the limit; None when it may start."""
    chain = await runs.ancestor_definition_names(rt.pool, run_id)
    path = " → ".join([*reversed(chain), workflow])
    limit = rt.settings.max_workflow_depth
    if workflow in chain:
        return NestingProblem("WORKFLOW_RECURSION", path, len(chain) + 1, limit)
    if len(chain) + 1 > limit:
        return NestingProblem("WORKFLOW_DEPTH_EXCEEDED", path, len(chain) + 1, limit)
    return None


class WorkflowKind(CallKind):
    """Calls of a workflow offered as a tool (`{"name", "workflow"}`, or a stored workflow named
    by reference)."""

    kind = AwaitedKind.WORKFLOW
    pause_reason = PauseReason.CHILD_RUNS
    pause_rank = 2
    details_key = "workflowCalls"

    def answers(self, tool: ToolEntry) -> bool:
        return isinstance(tool, WorkflowToolDef)

    async def offer(self, rt: Runtime, workspace_id: str, entry: ToolRef | WorkflowToolDef) -> Offered | None:
        """A workflow tool, or a bare name no handler is registered for that names a stored
        workflow of the workspace (Dagu's form): the tool the model sees."""
        if not isinstance(entry, WorkflowToolDef):
            if await find_version(rt.pool, workspace_id, entry.name, None) is None:
                return None
            entry = WorkflowToolDef(name=entry.name, workflow=entry.name)
        row = await find_version(rt.pool, workspace_id, entry.workflow, entry.version)
        parameters = entry.parameters or (workflow_input_schema(row) if row is not None else None)
        description = entry.description or (row["description"] if row is not None else None)
        spec = ToolSpec(
            entry.name,
            description or f"Run the '{entry.workflow}' workflow",
            parameters or {"type": "object", "properties": {}},
        )
        return Offered(entry, spec)

    async def prepare(self, handing: HandingOver) -> NewAwaitedCall | ToolOutcome:
        """The call with the child run to start with it; or why it cannot start (the model is told)."""
        tool, arguments, rt, ex = handing.tool, handing.call.arguments, handing.rt, handing.ex
        assert isinstance(tool, WorkflowToolDef)  # `answers` took only these
        row = await find_version(rt.pool, ex.workspace_id, tool.workflow, tool.version)
        if row is None:
            what = f"'{tool.workflow}'" + (f" version '{tool.version}'" if tool.version else "")
            return failed_call(arguments, "WORKFLOW_NOT_FOUND", f"Workflow {what} does not exist")
        nesting = await nesting_problem(rt, ex.run_id, tool.workflow)
        if nesting is not None:
            if nesting.code == "WORKFLOW_RECURSION":
                message = f"Workflow '{tool.workflow}' is already running above this call ({nesting.path})"
            else:
                message = f"Calling workflow '{tool.workflow}' would nest runs {nesting.depth} deep (limit {nesting.limit})"
            return failed_call(arguments, nesting.code, message)
        child_input = arguments
        schema = workflow_input_schema(row)
        if schema is not None:
            child_input = with_defaults(schema, arguments)
            problems = schema_problems(schema, child_input)
            if problems:
                return failed_call(
                    arguments,
                    "INVALID_ARGUMENTS",
                    f"Invalid input for workflow '{tool.workflow}': {'; '.join(problems)}",
                )
        return replace(handing.call, child_definition_id=row["id"], child_input=child_input)

    def pause_detail(self, call: NewAwaitedCall, tool: ToolEntry) -> dict[str, Any]:
        assert isinstance(tool, WorkflowToolDef)
        return {"id": call.tool_call_id, "name": call.tool_name, "workflow": tool.workflow}

    async def on_handed_over(
        self, wait: WaitContext, calls: list[NewAwaitedCall], inserted: set[str]
    ) -> WaitPlan:
        """Start a child run for each workflow call recorded just now."""
        run = wait.run
        children = []
        started: list[str] = []
        for call in calls:
            if call.id not in inserted:
                continue  # a replayed round: its child run exists already
            assert call.child_definition_id is not None
            child = await runs.insert_run(
                wait.conn,
                workspace_id=run["workspace_id"],
                definition_id=call.child_definition_id,
                input=call.child_input or {},
                idempotency_key=None,
                parent_run_id=run["id"],
                parent_tool_call_id=call.tool_call_id,
                depth=run["depth"] + 1,
                trace_context=tracing.current_carrier(),  # the child run joins its parent's trace
                # A child run has its own budget: its definition's default within the ceiling.
                budget=budget_rules.resolve(
                    wait.rt.settings, (await wait.rt.definitions.get(call.child_definition_id)).budget
                ),
            )
            assert child is not None  # the definition was read from this workspace
            await db_awaited.set_child(wait.conn, call.id, child["id"])
            started.append(child["id"])
            children.append({"toolCallId": call.tool_call_id, "childRunId": child["id"]})
        return WaitPlan(pause_details={"childRuns": children} if children else {}, dispatch=tuple(started))


KIND = WorkflowKind()


async def answer_from_child(conn: asyncpg.Connection, child: DbRow) -> list[str]:
    """Called in the child's terminal transaction: write the parent's result for the call that
    started `child`; returns the parent to dispatch after commit when it has nothing else
    pending. A parent that is not WAITING (cancelled, or not yet waiting) is left alone; the
    sweep retries the latter."""
    call = await db_awaited.for_child(conn, child["id"])
    if call is None or call["status"] != AwaitedStatus.PENDING:
        return []
    parent = await runs.lock_run(conn, call["workflow_run_id"])
    if parent is None or parent["status"] != RunStatus.WAITING:
        return []
    result = await _child_result(conn, child, call)
    if await answer(conn, parent, [result], reason=ResumeReason.CHILD_RUN):
        return [parent["id"]]
    return []


async def _child_result(conn: asyncpg.Connection, child: DbRow, call: DbRow) -> Answer:
    if child["status"] == RunStatus.COMPLETED:
        return Answer(call, ok=True, output=child["output"], answered_by=AnsweredBy.WORKFLOW)
    name = await db_definitions.name_of(conn, child["definition_id"])
    error = child["error"] or {}
    code = error.get("code") or child["status"]
    message = error.get("message") or ("Run was cancelled" if child["status"] == RunStatus.CANCELLED else "")
    text = f"Workflow '{name}' run {child['id']} {child['status']}: {code}: {message}"
    return Answer(
        call,
        ok=False,
        error=text,
        error_code="CHILD_RUN_CANCELLED" if child["status"] == RunStatus.CANCELLED else "CHILD_RUN_FAILED",
        model_error={"error": text, "childRunId": child["id"]},
        answered_by=AnsweredBy.WORKFLOW,
    )


async def answer_finished_children(pool: asyncpg.Pool) -> list[str]:
    """Recovery: answer workflow calls whose child ended while the parent could not be told.
    Returns the parent runs to dispatch."""
    dispatch: list[str] = []
    for row in await db_awaited.unanswered_finished_children(pool):
        async with pool.acquire() as conn, conn.transaction():
            child = await runs.lock_run(conn, row["child_run_id"])
            if child is not None:
                dispatch += await answer_from_child(conn, child)
    return dispatch
