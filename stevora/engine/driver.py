"""The run driver: advances one leased run until it waits, finishes, fails or loses its lease.

The driver is a state machine over the run's *current step run*:

    PENDING   → start it (RUNNING, STEP_STARTED) and execute
    RUNNING   → execute (also after a crash: tasks run again, llm steps resume from checkpoints)
    WAITING   → if due: the step type says what a due wait means; else release
    COMPLETED → advance to the next step (or the condition's target), or complete the run
    FAILED    → schedule the next attempt (RetryPolicy, via nextRunAt) or fail the run

Each arrow is one transaction whose guarded updates are fenced by the lease, and the events it
writes are in that same transaction. Anything that happened outside the driver (a signal, an
approval decision, a cancel) is just a row in a new status that the next pass reacts to.

A pass works from the rows the previous transition's statement returned (`Position`) and reads
the run and its step run only when it has none: at a drive's start without a claimed row, and
after a transition that does not return them. A run's fixed path is thus claim, start (run and
first step RUNNING, one statement), the step's checkpoints, and completion (last step and run
COMPLETED with the webhook outbox, one statement) — see `stevora.db.transitions`.

A lost database connection (restart, failover, `pg_terminate_backend`) is not a step failure:
the pass is retried with backoff. That is safe because a retried pass starts by re-reading the
run and its current step run, so a transition whose COMMIT outcome was unknown is simply seen
done (or not) on the next read. After a bounded budget the error goes up to the run pool, which
hands the lease back so the sweep redispatches the run.

The driver knows step types only through `stevora.engine.steps` and writes only through
`stevora.db` and `stevora.engine.endings`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.clock import iso, utcnow
from stevora.db import runs, transitions
from stevora.db.runs import RELEASE
from stevora.db.transient import Retrier, is_transient
from stevora.definitions import WorkflowDefinitionSpec, compute_next_retry_delay_ms
from stevora.engine import endings
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps.base import StepExecution, WaitContext
from stevora.engine.steps.registry import step_type
from stevora.errors import InvalidStateTransition, LeaseLost, StevoraError
from stevora.events import Event, EventType, step_completed, step_failed
from stevora.observability import hooks as observe
from stevora.statuses import TERMINAL_RUN_STATUSES, PauseReason, ResumeReason, RunStatus, StepStatus
from stevora.tasks import StepResult, exception_error

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.engine")

# A condition loop that never exits would otherwise run forever.
MAX_VISITS_PER_STEP = 1000

# Timers fire a little late rather than early: an early message finds the run not yet due.
_TIMER_SLACK_MS = 10


def delay_until(when: datetime) -> int:
    return max(0, math.ceil((when - utcnow()).total_seconds() * 1000)) + _TIMER_SLACK_MS


@dataclass(frozen=True, slots=True)
class Position:
    """Where a run stands after a transition this driver committed: the rows its statement returned.

    The next pass takes them instead of re-reading the run and its step run. That is safe because
    while this driver holds the lease nothing else moves the run without the next write noticing:
    every write of the driver and of the step's checkpoints is fenced by `lease_owner` and an
    expected status, and a cancel (releases the lease), a pause (run leaves RUNNING) or a
    takeover (new owner) all break that fence, so a stale row is never acted on — the write finds
    zero rows and the pass ends with LeaseLost / InvalidStateTransition instead. The only window
    is a step starting just after such a change, as wide as it was with a fresh read. Transitions
    whose effects their rows do not show (a wait, a due check, a retry) return True instead, and
    the next pass reads again.
    """

    run: asyncpg.Record
    step_run: Any = None  # None: read the run's current step run
    # This driver just started this step run, attempt 1 of a new visit: it has no committed rounds.
    fresh: bool = False


# What a pass returns: False = this worker is done with the run; True = go on, reading the run
# again; a Position = go on from these rows.
Next = Position | bool


class RunDriver:
    def __init__(self, rt: Runtime, owner: str) -> None:
        self.rt = rt
        self.owner = owner
        self.pool: asyncpg.Pool = rt.pool

    async def drive(self, run_id: str, at: Position | None = None) -> None:
        """Advance a run this driver has claimed (`at`: the rows the claim returned; None reads
        them). Returns when the run no longer needs this worker."""
        retrier = Retrier("drive", workflow_run_id=run_id)
        while True:
            try:
                step = await self._step_once(run_id, at)
                if step is False:
                    return
                at = step if isinstance(step, Position) else None
                retrier.reset()
            except LeaseLost:
                log.info("lease_lost", workflow_run_id=run_id)
                return
            except Exception as exc:
                at = None  # the last write's outcome may be unknown: read again
                await retrier.pause(exc)  # re-raises unless a lost connection within budget

    async def _step_once(self, run_id: str, at: Position | None) -> Next:
        if at is None:
            run = await runs.get_run(self.pool, run_id)
            if run is None or run["lease_owner"] != self.owner:
                return False
            at = Position(run)
        run = at.run
        if run["status"] in TERMINAL_RUN_STATUSES or run["status"] == RunStatus.PAUSED:
            await self.release(run_id)
            return False
        definition = await self.rt.definitions.get(run["definition_id"])
        if run["status"] == RunStatus.PENDING:
            return await self._start(run)
        step_run = at.step_run
        if step_run is None:
            step_run = await runs.get_step_run(self.pool, run["current_step_run_id"])
        assert step_run is not None, f"run {run_id} has no current step run"
        status = step_run["status"]
        if status == StepStatus.PENDING:
            return await self._begin(run, step_run)
        if status == StepStatus.RUNNING:
            return await self._execute(run, step_run, definition, fresh=at.fresh)
        if status == StepStatus.WAITING:
            return await self._wake(run, step_run, definition)
        if status == StepStatus.COMPLETED:
            return await self._advance(run, step_run, definition)
        if status == StepStatus.FAILED:
            return await self._handle_failure(run, step_run, definition)
        raise RuntimeError(f"step run {step_run['id']} in unexpected status {status}")

    async def release(self, run_id: str) -> None:
        await runs.release(self.pool, run_id, self.owner)

    async def _dispatch(self, run_ids: list[str]) -> None:
        if run_ids:
            self.rt.faults.reached("parent_told")
        for run_id in run_ids:
            await dispatch_hint(self.rt.dispatcher, run_id)

    # -- transitions ---------------------------------------------------------------------------

    async def _start(self, run: asyncpg.Record) -> Position:
        """PENDING → RUNNING with the first step run started. The claim does this already
        (`transitions.claim`); this is for a PENDING run leased without it."""
        run, step_run = await transitions.start(self.pool, run["id"], self.owner, self.rt.settings.lease_s)
        log.info("run_started", workflow_run_id=run["id"])
        return Position(run, step_run, fresh=True)

    async def _begin(self, run: asyncpg.Record, step_run: asyncpg.Record) -> Position:
        async with self.pool.acquire() as conn, conn.transaction():
            started = await runs.update_step(
                conn,
                step_run["id"],
                expect=[StepStatus.PENDING],
                sets={"status": StepStatus.RUNNING},
                now_columns=["started_at"],
            )
            run = await runs.update_run(
                conn,
                run["id"],
                expect=[RunStatus.RUNNING],
                owner=self.owner,
                sets={"current_step_name": step_run["step_name"], "next_run_at": None},
                events=[_step_started(step_run)],
            )
        # Attempt 1 is always a new visit (`next_visit` when it was inserted): nothing committed yet.
        return Position(run, started, fresh=started["attempt"] == 1)

    async def _execute(
        self,
        run: asyncpg.Record,
        step_run: asyncpg.Record,
        definition: WorkflowDefinitionSpec,
        *,
        fresh: bool,
    ) -> Next:
        step = definition.step(step_run["step_name"])
        ex = StepExecution(
            run_id=run["id"],
            workspace_id=run["workspace_id"],
            owner=self.owner,
            step_run_id=step_run["id"],
            step_name=step_run["step_name"],
            step_index=step_run["step_index"],
            visit=step_run["visit"],
            attempt=step_run["attempt"],
            input=run["input"] or {},
            state=run["state"] or {},
            started_at=step_run["started_at"],
            fresh=fresh,
        )
        bound = log.bind(workflow_run_id=run["id"], step_name=ex.step_name, attempt=ex.attempt)
        self.rt.faults.reached("step_started", ex.step_name)
        try:
            with observe.step(
                ex.run_id, ex.step_run_id, ex.step_name, step_run["step_type"], ex.attempt
            ) as obs:
                result = await step_type(step_run["step_type"]).execute(self.rt, ex, step)
                obs.status = result.status
        except LeaseLost:
            raise
        except StevoraError as exc:
            result = StepResult(status="failed", error=exc.to_dict(), retryable=exc.retryable)
        except Exception as exc:
            if is_transient(exc):
                raise  # the database went away (or rolled back a deadlock): retry the pass, not a failed attempt
            # A step type's bug must fail the step, never the worker.
            bound.warning("step_raised", error=repr(exc), exc_info=exc)
            result = StepResult(status="failed", error=exception_error(exc))
        if result.status == "completed":
            result = _check_next_step(result, definition, ex.step_name)
        if result.status == "completed":
            return await self._record(
                run["id"], lambda: self._complete_step(run, step_run, result, definition)
            )
        if result.status == "waiting":
            await self._record(run["id"], lambda: self._wait(run, step_run, step, result))
            return False
        await self._record(run["id"], lambda: self._fail_step(run, step_run, result))
        return True

    async def _record(self, run_id: str, transition: Callable[[], Awaitable[Next | None]]) -> Next:
        """Commit the outcome of an execution, retrying lost connections in place; returns what
        the transition returns (True when it returns nothing).

        Retrying the whole pass instead would run the handler again. If a try died during COMMIT
        and had committed, the retry finds the step no longer RUNNING (InvalidStateTransition):
        the outcome is recorded, and the next pass reads where the run is."""
        retrier = Retrier("record_step_outcome", workflow_run_id=run_id)
        while True:
            try:
                outcome = await transition()
                return True if outcome is None else outcome
            except InvalidStateTransition:
                if not retrier.outcome_unknown:
                    raise
                return True
            except Exception as exc:
                await retrier.pause(exc)

    async def _complete_step(
        self,
        run: asyncpg.Record,
        step_run: asyncpg.Record,
        result: StepResult,
        definition: WorkflowDefinitionSpec,
    ) -> Next:
        """Complete the step and move on in one go: the next step run is inserted (or the run
        ends) in the transaction that completes this one, and the last step of a run without a
        parent completes with its run in a single statement."""
        output = dict(result.output or {})
        if result.next_step is not None:
            output["__nextStep"] = result.next_step
        last = step_run["step_index"] + 1 >= len(definition.steps) and not output.get("__nextStep")
        if last and run["parent_run_id"] is None:
            await endings.complete_with_last_step(
                self.pool,
                run,
                step_run["id"],
                owner=self.owner,
                output=output,
                state_updates=result.state_updates,
            )
            return False
        wake: list[str] = []
        async with self.pool.acquire() as conn, conn.transaction():
            done = await runs.update_step(
                conn,
                step_run["id"],
                expect=[StepStatus.RUNNING],
                sets={"status": StepStatus.COMPLETED, "output": output},
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
            more = await self._advance_in(conn, run, done, definition, wake)
        await self._dispatch(wake)
        return more

    async def _wait(
        self, run: asyncpg.Record, step_run: asyncpg.Record, step: Any, result: StepResult
    ) -> None:
        until = result.wait_until
        reason = result.pause_reason or PauseReason.WAIT
        async with self.pool.acquire() as conn, conn.transaction():
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
        for other in plan.dispatch:
            await dispatch_hint(self.rt.dispatcher, other)
        if until is not None:
            await dispatch_hint(self.rt.dispatcher, run["id"], delay_ms=delay_until(until))

    async def _fail_step(self, run: asyncpg.Record, step_run: asyncpg.Record, result: StepResult) -> None:
        error = dict(result.error or {"message": "Step failed"})
        error.setdefault("code", "STEP_FAILED")
        error["retryable"] = result.retryable and error.get("retryable", True) is not False
        async with self.pool.acquire() as conn, conn.transaction():
            await runs.update_step(
                conn,
                step_run["id"],
                expect=[StepStatus.RUNNING],
                sets={"status": StepStatus.FAILED, "error": error},
                now_columns=["completed_at"],
            )
            await runs.update_run(
                conn,
                run["id"],
                expect=[RunStatus.RUNNING],
                owner=self.owner,
                events=[step_failed(step_run, error)],
            )

    async def _wake(
        self, run: asyncpg.Record, step_run: asyncpg.Record, definition: WorkflowDefinitionSpec
    ) -> bool:
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

    async def _advance(
        self, run: asyncpg.Record, step_run: asyncpg.Record, definition: WorkflowDefinitionSpec
    ) -> Next:
        wake: list[str] = []
        async with self.pool.acquire() as conn, conn.transaction():
            more = await self._advance_in(conn, run, step_run, definition, wake)
        await self._dispatch(wake)
        return more

    async def _advance_in(
        self,
        conn: asyncpg.Connection,
        run: asyncpg.Record,
        step_run: asyncpg.Record,
        definition: WorkflowDefinitionSpec,
        wake: list[str],
    ) -> Next:
        """Insert the step run that comes after `step_run` (or end the run); returns the rows to go
        on from, or False when the run ended."""
        steps = definition.steps
        index = step_run["step_index"]
        target = (step_run["output"] or {}).get("__nextStep")
        if target and target not in _step_names(definition):
            # Recorded before targets were checked: fail the run instead of crashing each pass.
            error = {
                **_unknown_target_error(target, step_run["step_name"]),
                "stepName": step_run["step_name"],
            }
            await endings.fail_run(conn, run["id"], error, owner=self.owner, wake=wake)
            return False
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
            await endings.complete_run(conn, run["id"], owner=self.owner, wake=wake, events=events)
            return False
        step = steps[next_index]
        visit = await runs.next_visit(conn, run["id"], step.name)
        if visit > MAX_VISITS_PER_STEP:
            error = {
                "code": "STEP_VISIT_LIMIT",
                "stepName": step.name,
                "message": f"Step '{step.name}' was entered more than {MAX_VISITS_PER_STEP} times",
            }
            await endings.fail_run(conn, run["id"], error, owner=self.owner, wake=wake, events=events)
            return False
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
            events=[*events, _step_started(new)],
        )
        return Position(run, new, fresh=True)

    async def _handle_failure(
        self, run: asyncpg.Record, step_run: asyncpg.Record, definition: WorkflowDefinitionSpec
    ) -> bool:
        step = definition.step(step_run["step_name"])
        policy = step.effective_retry()
        error = dict(step_run["error"] or {})
        attempt = step_run["attempt"]
        if not (error.get("retryable", True) and attempt < policy.max_attempts):
            wake: list[str] = []
            async with self.pool.acquire() as conn, conn.transaction():
                error = {**error, "stepName": step.name, "attempts": attempt}
                await endings.fail_run(conn, run["id"], error, owner=self.owner, wake=wake)
            await self._dispatch(wake)
            return False
        delay_ms = compute_next_retry_delay_ms(policy, attempt)
        async with self.pool.acquire() as conn, conn.transaction():
            new = await runs.insert_step_run(
                conn,
                run_id=run["id"],
                step_name=step.name,
                step_type=step.type,
                step_index=step_run["step_index"],
                visit=step_run["visit"],
                attempt=attempt + 1,
            )
            await runs.update_run(
                conn,
                run["id"],
                expect=[RunStatus.RUNNING],
                owner=self.owner,
                sets={
                    "current_step_run_id": new["id"],
                    "next_run_at": utcnow() + timedelta(milliseconds=delay_ms),
                    **RELEASE,
                },
                events=[
                    Event(
                        EventType.STEP_RETRYING,
                        {
                            "stepName": step.name,
                            "attempt": attempt,
                            "nextAttempt": attempt + 1,
                            "maxAttempts": policy.max_attempts,
                            "delayMs": delay_ms,
                            "error": error,
                        },
                        new["id"],
                    )
                ],
            )
        await dispatch_hint(self.rt.dispatcher, run["id"], delay_ms=delay_ms + _TIMER_SLACK_MS)
        return False


def _step_started(step_run: Any) -> Event:
    return Event(
        EventType.STEP_STARTED,
        {
            "stepName": step_run["step_name"],
            "stepType": step_run["step_type"],
            "attempt": step_run["attempt"],
            "visit": step_run["visit"],
        },
        step_run["id"],
    )


def _step_names(definition: WorkflowDefinitionSpec) -> set[str]:
    return {s.name for s in definition.steps}


def _unknown_target_error(target: Any, step_name: str) -> dict[str, Any]:
    return {
        "code": "UNKNOWN_NEXT_STEP",
        "message": f"Step '{step_name}' returned __nextStep '{target}', which is not a step of this workflow",
        "retryable": False,
        "details": {"nextStep": target},
    }


def _check_next_step(result: StepResult, definition: WorkflowDefinitionSpec, step_name: str) -> StepResult:
    """A completed result whose `__nextStep` names no step fails the step (not retryable)."""
    target = result.next_step or (result.output or {}).get("__nextStep")
    if target is None or (isinstance(target, str) and target in _step_names(definition)):
        return result
    return StepResult(status="failed", error=_unknown_target_error(target, step_name), retryable=False)
