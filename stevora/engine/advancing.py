"""The run driver's advancing: complete a step and move on (the next step run, a condition's
target, skipped steps, or the run's ending) in the transaction that completes it."""

from __future__ import annotations

import functools
from typing import Any

import asyncpg

from stevora.db import runs
from stevora.db.reads.rows import DbRow
from stevora.definitions import WorkflowDefinitionSpec
from stevora.engine import endings
from stevora.engine.driving import DriverCore, Next, Position, step_started
from stevora.events import Event, EventType, step_completed
from stevora.statuses import RunStatus, StepStatus
from stevora.tasks import StepResult

# A condition loop that never exits would otherwise run forever.
MAX_VISITS_PER_STEP = 1000


class Advancing(DriverCore):
    async def _complete_step(
        self,
        run: DbRow,
        step_run: DbRow,
        result: StepResult,
        definition: WorkflowDefinitionSpec,
    ) -> Next:
        """Complete the step and move on in one go: the next step run is inserted (or the run
        ends) in the transaction that completes this one, and the last step completes with its
        run in a single statement (in a transaction that also tells the run's parent, or wakes
        its concurrency slot's queue, when it has one)."""
        output = dict(result.output or {})
        if result.next_step is not None:
            output["__nextStep"] = result.next_step
        last = step_run["step_index"] + 1 >= len(definition.steps) and not output.get("__nextStep")
        if last:
            end = functools.partial(
                endings.complete_with_last_step,
                run=run,
                step_run_id=step_run["id"],
                owner=self.owner,
                output=output,
                state_updates=result.state_updates,
            )
            if not endings.announces(run):
                # One statement, no transaction around it; runs ending together share it.
                ended = await end(self.rt.committer)
            else:
                async with self.pool.acquire() as conn, conn.transaction():
                    ended = await end(conn)
            await endings.after_commit(self.rt, ended)
            return False
        async with self.pool.acquire() as conn, conn.transaction():
            done = await runs.update_step(
                conn,
                step_run["id"],
                expect=[StepStatus.RUNNING],
                sets={
                    "status": StepStatus.COMPLETED,
                    "output": output,
                    "state_updates": result.state_updates,
                },
                now_columns=["completed_at"],
            )
            run = await runs.update_run(
                conn,
                run["id"],
                expect=[RunStatus.RUNNING],
                owner=self.owner,
                merge_state=result.state_updates,
                events=[step_completed(done)],
            )
            more = await self._advance_in(conn, run, done, definition)
        return await self._went_on(more)

    async def _advance(self, run: DbRow, step_run: DbRow, definition: WorkflowDefinitionSpec) -> Next:
        async with self.pool.acquire() as conn, conn.transaction():
            more = await self._advance_in(conn, run, step_run, definition)
        return await self._went_on(more)

    async def _went_on(self, more: Position | endings.Ended) -> Next:
        """After the commit: the rows to go on from, or (the run ended) dispatch what its ending
        woke and stop."""
        if isinstance(more, endings.Ended):
            await endings.after_commit(self.rt, more)
            return False
        return more

    async def _advance_in(
        self,
        conn: asyncpg.Connection,
        run: DbRow,
        step_run: DbRow,
        definition: WorkflowDefinitionSpec,
    ) -> Position | endings.Ended:
        """Insert the step run that comes after `step_run` (or end the run); returns the rows to go
        on from, or the run's ending."""
        steps = definition.steps
        index = step_run["step_index"]
        target = (step_run["output"] or {}).get("__nextStep")
        if target and target not in _step_names(definition):
            # Recorded before targets were checked: fail the run instead of crashing each pass.
            error = {
                **_unknown_target_error(target, step_run["step_name"]),
                "stepName": step_run["step_name"],
            }
            return await endings.fail_run(conn, run["id"], error, owner=self.owner)
        next_index = definition.index_of(target) if target else index + 1
        events: list[Event] = []
        # A forward jump skips the steps in between; they get SKIPPED rows so the timeline says so.
        for skipped in steps[index + 1 : next_index] if next_index > index + 1 else []:
            visit = await runs.next_visit(conn, run["id"], skipped.name)
            row = await runs.insert_step_run(
                conn,
                run_id=run["id"],
                step_name=skipped.name,
                step_type=skipped.type,
                step_index=definition.index_of(skipped.name),
                visit=visit,
                attempt=1,
                status=StepStatus.SKIPPED,
            )
            events.append(Event(EventType.STEP_SKIPPED, {"stepName": skipped.name}, row["id"]))
        if next_index >= len(steps):
            return await endings.complete_run(conn, run["id"], owner=self.owner, events=events)
        step = steps[next_index]
        visit = await runs.next_visit(conn, run["id"], step.name)
        if visit > MAX_VISITS_PER_STEP:
            error = {
                "code": "STEP_VISIT_LIMIT",
                "stepName": step.name,
                "message": f"Step '{step.name}' was entered more than {MAX_VISITS_PER_STEP} times",
            }
            return await endings.fail_run(conn, run["id"], error, owner=self.owner, events=events)
        # Inserted RUNNING (what `_begin` would do next, saved a transaction): a new visit, so fresh.
        new = await runs.insert_step_run(
            conn,
            run_id=run["id"],
            step_name=step.name,
            step_type=step.type,
            step_index=next_index,
            visit=visit,
            attempt=1,
            status=StepStatus.RUNNING,
        )
        run = await runs.update_run(
            conn,
            run["id"],
            expect=[RunStatus.RUNNING],
            owner=self.owner,
            sets={"current_step_name": step.name, "current_step_run_id": new["id"], "next_run_at": None},
            events=[*events, step_started(new)],
        )
        return Position(run, new, fresh=True)


def _step_names(definition: WorkflowDefinitionSpec) -> set[str]:
    return {s.name for s in definition.steps}


def _unknown_target_error(target: Any, step_name: str) -> dict[str, Any]:
    return {
        "code": "UNKNOWN_NEXT_STEP",
        "message": f"Step '{step_name}' returned __nextStep '{target}', which is not a step of this workflow",
        "retryable": False,
        "details": {"nextStep": target},
    }


def check_next_step(result: StepResult, definition: WorkflowDefinitionSpec, step_name: str) -> StepResult:
    """A completed result whose `__nextStep` names no step fails the step (not retryable); a tool's
    `ctx.goto` (an llm step's `goto` output) with GOTO_UNKNOWN_STEP, naming the tool and the step."""
    target = result.next_step or (result.output or {}).get("__nextStep")
    if target is None or (isinstance(target, str) and target in _step_names(definition)):
        return result
    goto = (result.output or {}).get("goto")
    if isinstance(goto, dict):
        error = {
            "code": "GOTO_UNKNOWN_STEP",
            "message": f"Tool '{goto.get('toolName')}' went to step '{target}', which is not a step "
            f"of this workflow (steps: {', '.join(s.name for s in definition.steps)})",
            "retryable": False,
            "details": {
                "gotoStep": target,
                "toolName": goto.get("toolName"),
                "toolCallId": goto.get("toolCallId"),
            },
        }
        return StepResult(status="failed", error=error, retryable=False)
    return StepResult(status="failed", error=_unknown_target_error(target, step_name), retryable=False)
