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
`stevora.db` and `stevora.engine.endings`. Its transitions are split by concern: `advancing`
(COMPLETED → next), `waiting` (→ WAITING, and WAITING when due), `retrying` (FAILED → retry or
fail the run); this module drives the passes, starts steps and executes them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from stevora.db import runs, transitions
from stevora.db.checkpoints import Inbox
from stevora.db.reads.rows import DbRow
from stevora.db.transient import Retrier, is_transient
from stevora.definitions import WorkflowDefinitionSpec
from stevora.engine import limits
from stevora.engine.advancing import MAX_VISITS_PER_STEP, Advancing, check_next_step
from stevora.engine.driving import Next, Position, delay_until, step_started
from stevora.engine.retrying import Retrying
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.registry import step_type
from stevora.engine.waiting import Waiting
from stevora.errors import InvalidStateTransition, LeaseLost, StevoraError
from stevora.observability import hooks as observe
from stevora.statuses import TERMINAL_RUN_STATUSES, RunStatus, StepStatus
from stevora.tasks import StepResult, exception_error

log = structlog.get_logger("stevora.engine")

__all__ = ["MAX_VISITS_PER_STEP", "Position", "RunDriver", "delay_until"]


class RunDriver(Advancing, Waiting, Retrying):
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

    # -- transitions ---------------------------------------------------------------------------

    async def _start(self, run: DbRow) -> Position:
        """PENDING → RUNNING with the first step run started. The claim does this already
        (`transitions.claim`); this is for a PENDING run leased without it."""
        run, step_run = await transitions.start(self.pool, run["id"], self.owner, self.rt.settings.lease_s)
        log.info("run_started", workflow_run_id=run["id"])
        return Position(run, step_run, fresh=True)

    async def _begin(self, run: DbRow, step_run: DbRow) -> Position:
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
                events=[step_started(step_run)],
            )
        # Attempt 1 is always a new visit (`next_visit` when it was inserted): nothing committed yet.
        return Position(run, started, fresh=started["attempt"] == 1)

    async def _execute(
        self,
        run: DbRow,
        step_run: DbRow,
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
            budget=run["budget"],
            thread_id=_conversation_of(run, definition, step_run),
            # Messages sent to the run wait (the row this pass started from says so), or a resumed
            # execution may owe its next round messages a lost one took (docs/threads.md).
            inbox=Inbox(pending=not fresh or run.get("pending_messages", 1) > 0),
            replay=(run["replay_of"], run["replay_tools"]) if "replay_tools" in run else None,
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
            result = limits.checked_result(
                self.rt.settings, ex.state, check_next_step(result, definition, ex.step_name)
            )
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


def _conversation_of(run: DbRow, definition: WorkflowDefinitionSpec, step_run: DbRow) -> str | None:
    """The run's thread, when this step carries its conversation: the definition's first `llm`
    step, on its first visit (docs/threads.md)."""
    thread_id: str | None = run.get("thread_id")
    if thread_id is None or step_run["visit"] != 1:
        return None
    first = next((s.name for s in definition.steps if s.type == "llm"), None)
    return thread_id if first == step_run["step_name"] else None
