"""`external_event`: waits for a signal, a `resume` call carrying `signalType`, or an event
(`event` + `match`; answered by `stevora.triggers.waits` through `deliver_signal`).

* Going WAITING records the awaited `signal_type` on the step run; nothing else.
* Due: after `timeoutMs` (if set) the step fails with TIMEOUT (the base step type's `on_due`).
* Answered: `deliver_signal` (through `stevora.engine.commands.resume_run`) completes the step with
  `{signalType, payload}` and merges the payload into the run's state.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.clock import utcnow
from stevora.db import runs
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.definitions import ExternalEventStep
from stevora.engine import limits
from stevora.engine.steps.base import StepExecution, StepType
from stevora.errors import ConflictError, InvalidStateTransition
from stevora.events import Event, EventType, step_completed
from stevora.statuses import PauseReason, ResumeReason, RunStatus, StepStatus
from stevora.tasks import StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime
    from stevora.settings import Settings


class ExternalEventStepType(StepType):
    name = "external_event"
    waits_for = "signal"

    async def execute(self, rt: Runtime, ex: StepExecution, step: ExternalEventStep) -> StepResult:
        until = utcnow() + timedelta(milliseconds=step.timeout_ms) if step.timeout_ms else None
        return StepResult(
            status="waiting",
            signal_type=step.awaited_signal(),
            wait_until=until,
            pause_reason=PauseReason.EXTERNAL_EVENT,
        )


async def deliver_signal(
    conn: asyncpg.Connection,
    settings: Settings,
    run: DbRow,
    signal_type: str,
    payload: dict[str, Any] | None,
    *,
    output: dict[str, Any] | None = None,
) -> DbRow:
    """Complete the run's waiting `external_event` step with the signal (payload merged into
    state), in the caller's transaction; returns the run row. The caller dispatches after commit.
    An event answering the step (`stevora.triggers.waits`) passes its data as `output` too."""
    step_run = (
        await runs.get_step_run(conn, run["current_step_run_id"]) if run["current_step_run_id"] else None
    )
    if (
        run["status"] != RunStatus.WAITING
        or step_run is None
        or step_run["status"] != StepStatus.WAITING
        or step_run["step_type"] != ExternalEventStepType.name
    ):
        raise InvalidStateTransition(
            "Workflow run is not waiting for an external event",
            details={"workflowRunId": run["id"], "status": run["status"]},
        )
    if step_run["signal_type"] != signal_type:
        raise ConflictError(
            f"Run is waiting for signal '{step_run['signal_type']}', not '{signal_type}'",
            code="SIGNAL_MISMATCH",
            details={"expectedSignalType": step_run["signal_type"], "signalType": signal_type},
        )
    limits.check_state_merge(settings, run["state"], payload)
    done = await runs.update_step(
        conn,
        step_run["id"],
        expect=[StepStatus.WAITING],
        sets={
            "status": StepStatus.COMPLETED,
            "output": output if output is not None else {"signalType": signal_type, "payload": payload or {}},
        },
        now_columns=["completed_at"],
    )
    row: DbRow = await runs.update_run(
        conn,
        run["id"],
        expect=[RunStatus.WAITING],
        sets={"status": RunStatus.RUNNING, "next_run_at": None, **RELEASE},
        merge_state=payload or None,
        now_columns=["dispatched_at"],
        events=[
            step_completed(done),
            Event(
                EventType.WORKFLOW_RESUMED,
                {
                    "reason": ResumeReason.SIGNAL,
                    "signalType": signal_type,
                    "payloadKeys": sorted((payload or {}).keys()),
                },
                step_run["id"],
            ),
        ],
    )
    return row
