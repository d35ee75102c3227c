"""`task`: runs the handler registered under the step's `handler`, passing it `config`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stevora.definitions import TaskStep
from stevora.engine.steps.base import StepExecution, StepType
from stevora.tasks import StepContext, StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime


class TaskStepType(StepType):
    name = "task"

    async def execute(self, rt: Runtime, ex: StepExecution, step: TaskStep) -> StepResult:
        task = rt.tasks.get(step.handler)
        if task is None:
            return StepResult(
                status="failed",
                error={
                    "code": "HANDLER_NOT_REGISTERED",
                    "message": f"No task handler registered for '{step.handler}'",
                },
                retryable=False,
            )
        ctx = StepContext(
            workflow_run_id=ex.run_id,
            workspace_id=ex.workspace_id,
            step_name=ex.step_name,
            step_run_id=ex.step_run_id,
            attempt=ex.attempt,
            workflow_input=ex.input,
            workflow_state=ex.state,
            config=step.config,
        )
        return await rt.tasks.call(task, ctx, step)
