"""`external_event`: waits for a `resume` call carrying `signalType` (delivered by
`stevora.engine.commands.resume_run`); fails with TIMEOUT after `timeoutMs` if set."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from stevora.clock import utcnow
from stevora.definitions import ExternalEventStep
from stevora.engine.steps.base import StepExecution, StepType
from stevora.tasks import StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime


class ExternalEventStepType(StepType):
    name = "external_event"
    waits_for = "signal"

    async def execute(self, rt: Runtime, ex: StepExecution, step: ExternalEventStep) -> StepResult:
        until = utcnow() + timedelta(milliseconds=step.timeout_ms) if step.timeout_ms else None
        return StepResult(
            status="waiting", signal_type=step.signal_type, wait_until=until, pause_reason="external_event"
        )
