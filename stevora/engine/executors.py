"""One executor per step type: given the step and the run's input/state, produce a StepResult.

Executors do not touch run or step rows; the driver (runner.py) records what they return.
The `llm` executor lives in stevora.llm.loop because it checkpoints every round itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from stevora.clock import utcnow
from stevora.definitions import (
    ApprovalStep,
    ConditionStep,
    ExternalEventStep,
    LlmStep,
    TaskStep,
    WaitStep,
)
from stevora.engine import conditions
from stevora.engine.handlers import StepContext, StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime

APPROVAL_SIGNAL = "approval_decision"


@dataclass(frozen=True, slots=True)
class StepExecution:
    """The identity and inputs of one step attempt, as the driver claimed it."""

    run_id: str
    workspace_id: str
    owner: str  # lease owner: every write of this attempt is fenced by it
    step_run_id: str
    step_name: str
    step_index: int
    visit: int
    attempt: int
    input: dict[str, Any]
    state: dict[str, Any]
    started_at: datetime | None


async def execute_task(rt: Runtime, ex: StepExecution, step: TaskStep) -> StepResult:
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


def execute_wait(step: WaitStep, started_at: datetime | None) -> StepResult:
    if step.until_timestamp is not None:
        until = step.until_timestamp
    else:
        assert step.duration_ms is not None  # the definition validator requires one of the two
        until = (started_at or utcnow()) + timedelta(milliseconds=step.duration_ms)
    return StepResult(status="waiting", wait_until=until)


def execute_condition(step: ConditionStep, state: dict[str, Any]) -> StepResult:
    result = conditions.evaluate(step.expression, state)
    target = step.true_step if result else step.false_step
    return StepResult(output={"result": result, "__nextStep": target}, next_step=target)


def execute_external_event(step: ExternalEventStep) -> StepResult:
    until = utcnow() + timedelta(milliseconds=step.timeout_ms) if step.timeout_ms else None
    return StepResult(status="waiting", signal_type=step.signal_type, wait_until=until)


def execute_approval(step: ApprovalStep, state: dict[str, Any]) -> StepResult:
    if step.content_key not in state:
        return StepResult(
            status="failed",
            error={
                "code": "APPROVAL_CONTENT_MISSING",
                "message": f"State has no key '{step.content_key}' to send for approval",
            },
            retryable=False,
        )
    until = utcnow() + timedelta(milliseconds=step.timeout_ms) if step.timeout_ms else None
    return StepResult(status="waiting", signal_type=APPROVAL_SIGNAL, wait_until=until)


async def execute_step(rt: Runtime, ex: StepExecution, step: Any) -> StepResult:
    if isinstance(step, TaskStep):
        return await execute_task(rt, ex, step)
    if isinstance(step, WaitStep):
        return execute_wait(step, ex.started_at)
    if isinstance(step, ConditionStep):
        return execute_condition(step, ex.state)
    if isinstance(step, ExternalEventStep):
        return execute_external_event(step)
    if isinstance(step, ApprovalStep):
        return execute_approval(step, ex.state)
    if isinstance(step, LlmStep):
        from stevora.llm.loop import execute_llm_step

        return await execute_llm_step(rt, ex, step)
    raise TypeError(f"unknown step type: {type(step).__name__}")
