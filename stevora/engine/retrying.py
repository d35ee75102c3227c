"""The run driver's retrying: record a failed attempt, then schedule the next one (RetryPolicy,
via nextRunAt) or fail the run."""

from __future__ import annotations

from datetime import timedelta

from stevora.clock import utcnow
from stevora.db import runs
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.definitions import WorkflowDefinitionSpec, compute_next_retry_delay_ms
from stevora.engine import endings
from stevora.engine.driving import TIMER_SLACK_MS, DriverCore
from stevora.engine.hints import dispatch_hint
from stevora.engine.provider_limits import RATE_LIMITED, deferred_too_often
from stevora.events import Event, EventType, step_failed
from stevora.statuses import RunStatus, StepStatus
from stevora.tasks import StepResult


class Retrying(DriverCore):
    async def _fail_step(self, run: DbRow, step_run: DbRow, result: StepResult) -> None:
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

    async def _handle_failure(self, run: DbRow, step_run: DbRow, definition: WorkflowDefinitionSpec) -> bool:
        step = definition.step(step_run["step_name"])
        policy = step.effective_retry()
        error = dict(step_run["error"] or {})
        attempt = step_run["attempt"]
        # A call the provider rate limit did not send is retried at its turn without spending an
        # attempt: nothing ran, the step waits for the budget (docs/flow-control.md).
        not_sent = error.get("code") == RATE_LIMITED
        if not_sent and (stop := await deferred_too_often(self.pool, self.rt.settings, step_run, error)):
            error, not_sent = stop, False
        if not (error.get("retryable", True) and (attempt < policy.max_attempts or not_sent)):
            async with self.pool.acquire() as conn, conn.transaction():
                error = {**error, "stepName": step.name, "attempts": attempt}
                ended = await endings.fail_run(conn, run["id"], error, owner=self.owner)
            await endings.after_commit(self.rt, ended)
            return False
        delay_ms = compute_next_retry_delay_ms(policy, attempt)
        if not_sent:  # no earlier than its turn
            delay_ms = max(delay_ms, int(1000 * ((error.get("details") or {}).get("retryAfterSeconds") or 0)))
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
        await dispatch_hint(self.rt.dispatcher, run["id"], delay_ms=delay_ms + TIMER_SLACK_MS)
        return False
