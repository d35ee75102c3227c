"""The run driver's waiting: a step going WAITING (its step type's WaitPlan written and dispatched
with it) and a wait that is due (its step type says what that means)."""

from __future__ import annotations

from typing import Any

from stevora.clock import iso, utcnow
from stevora.db import runs
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.definitions import WorkflowDefinitionSpec
from stevora.engine import budget, flow
from stevora.engine.driving import DriverCore, delay_until
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps.base import WaitContext
from stevora.engine.steps.registry import step_type
from stevora.events import Event, EventType, step_completed, step_failed
from stevora.statuses import PauseReason, ResumeReason, RunStatus, StepStatus
from stevora.tasks import StepResult


class Waiting(DriverCore):
    async def _wait(self, run: DbRow, step_run: DbRow, step: Any, result: StepResult) -> None:
        until = result.wait_until
        reason = result.pause_reason or PauseReason.WAIT
        async with self.pool.acquire() as conn, conn.transaction():
            # A budget raised after the step last read it must not be missed (budget.py).
            raised = reason == PauseReason.BUDGET and await budget.raised_since_stop(conn, run["id"], result)
            await runs.update_step(
                conn,
                step_run["id"],
                expect=[StepStatus.RUNNING],
                sets={"status": StepStatus.WAITING, "wait_until": until, "signal_type": result.signal_type},
            )
            wait = WaitContext(conn, self.rt, run, step_run, step, self.owner)
            plan = await step_type(step_run["step_type"]).on_waiting(wait, result)
            paused = Event(
                EventType.WORKFLOW_PAUSED,
                {
                    "reason": reason,
                    "signalType": result.signal_type,
                    "stepName": step_run["step_name"],
                    "waitUntil": iso(until),
                    **(result.pause_details or {}),
                    **plan.pause_details,
                },
                step_run["id"],
            )
            await runs.update_run(
                conn,
                run["id"],
                expect=[RunStatus.RUNNING],
                owner=self.owner,
                sets={"status": RunStatus.WAITING, "next_run_at": until, **RELEASE},
                events=[*plan.events, paused],
            )
            if raised:
                await budget.resume_raised(conn, run["id"], step_run)
        self.rt.faults.reached("wait_committed", step_run["step_type"])
        if raised:
            await dispatch_hint(self.rt.dispatcher, run["id"])
        # A run that gives up its concurrency slot while it waits wakes the runs queued for it.
        for other in (*plan.dispatch, *flow.released_by_wait(run)):
            await dispatch_hint(self.rt.dispatcher, other)
        if until is not None:
            await dispatch_hint(self.rt.dispatcher, run["id"], delay_ms=delay_until(until))

    async def _wake(self, run: DbRow, step_run: DbRow, definition: WorkflowDefinitionSpec) -> bool:
        due = step_run["wait_until"]
        if due is None or due > utcnow():
            # Dispatched early (or by a duplicate): hand the run back and come back when it is due.
            await self.release(run["id"])
            if due is not None:
                await dispatch_hint(self.rt.dispatcher, run["id"], delay_ms=delay_until(due))
            return False
        step = definition.step(step_run["step_name"])
        async with self.pool.acquire() as conn, conn.transaction():
            wait = WaitContext(conn, self.rt, run, step_run, step, self.owner)
            outcome = await step_type(step_run["step_type"]).on_due(wait)
            if outcome is None:
                return True
            if outcome.status == "completed":
                done = await runs.update_step(
                    conn,
                    step_run["id"],
                    expect=[StepStatus.WAITING],
                    sets={"status": StepStatus.COMPLETED, "output": outcome.output or {}},
                    now_columns=["completed_at"],
                )
                events = [
                    step_completed(done),
                    Event(
                        EventType.WORKFLOW_RESUMED,
                        {"reason": ResumeReason.TIMER, "stepName": step_run["step_name"]},
                        step_run["id"],
                    ),
                ]
            else:
                error = dict(outcome.error or {})
                await runs.update_step(
                    conn,
                    step_run["id"],
                    expect=[StepStatus.WAITING],
                    sets={"status": StepStatus.FAILED, "error": error},
                    now_columns=["completed_at"],
                )
                events = [step_failed(step_run, error)]
            await runs.update_run(
                conn,
                run["id"],
                expect=[RunStatus.WAITING, RunStatus.RUNNING],
                owner=self.owner,
                sets={"status": RunStatus.RUNNING, "next_run_at": None},
                events=events,
            )
        return True
