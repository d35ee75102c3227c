"""`wait`: pauses the run for `durationMs` or until `untilTimestamp`, holding no worker."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from stevora.clock import iso, utcnow
from stevora.definitions import WaitStep
from stevora.engine.steps.base import StepExecution, StepType, WaitContext
from stevora.statuses import PauseReason
from stevora.tasks import StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime


class WaitStepType(StepType):
    name = "wait"

    async def execute(self, rt: Runtime, ex: StepExecution, step: WaitStep) -> StepResult:
        if step.until_timestamp is not None:
            until = step.until_timestamp
        else:
            assert step.duration_ms is not None  # the definition validator requires one of the two
            until = (ex.started_at or utcnow()) + timedelta(milliseconds=step.duration_ms)
        return StepResult(status="waiting", wait_until=until, pause_reason=PauseReason.WAIT)

    async def on_due(self, wait: WaitContext) -> StepResult:
        return StepResult(output={"waitedUntil": iso(wait.step_run["wait_until"])})
