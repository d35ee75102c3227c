"""`task`: runs the handler registered under the step's `handler`, passing it `config`.

An attempt is bounded by the step's `timeoutMs` (default 300000): past it the attempt fails with
`TIMEOUT` (retryable, so the RetryPolicy decides) and the run moves on, so a hung handler never
holds its run's lease forever. An async handler is cancelled; a sync handler's thread cannot be
stopped by Python and finishes in the background, its result discarded.

A handler that raises fails the attempt with `STEP_FAILED`, its message and its traceback
(`stack`, truncated); the traceback also goes to the worker log.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

import structlog

from stevora.definitions import TaskStep
from stevora.engine.steps.base import StepExecution, StepType
from stevora.errors import StevoraError
from stevora.statuses import PauseReason
from stevora.tasks import StepContext, StepResult, exception_error

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.engine")

# A task step's `timeoutMs` when the definition gives none (docs/definitions.md).
DEFAULT_TASK_TIMEOUT_MS = 300_000


class TaskStepType(StepType):
    name = "task"

    async def execute(self, rt: Runtime, ex: StepExecution, step: TaskStep) -> StepResult:
        task = rt.tasks.get(step.handler)
        if task is None:
            return StepResult(
                status="failed",
                error={
                    "code": "HANDLER_NOT_REGISTERED",
                    "message": (
                        f"No task handler registered for '{step.handler}' in this worker: register it "
                        f"with `register_task_handler({step.handler!r}, fn)` (or `@task_handler`) in a "
                        f"module loaded with `stevora worker --tools MODULE` (or `stevora dev --tools`), "
                        f"then retry the run; retrying before that fails the same way"
                    ),
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
        timeout_ms = step.timeout_ms or DEFAULT_TASK_TIMEOUT_MS
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                return _paused_for(await rt.tasks.call(task, ctx, step))
        except TimeoutError:
            log.warning(
                "task_timed_out",
                workflow_run_id=ex.run_id,
                step_name=ex.step_name,
                timeout_ms=timeout_ms,
            )
            return StepResult(
                status="failed",
                error={
                    "code": "TIMEOUT",
                    "message": f"Task handler '{step.handler}' did not finish within {timeout_ms} ms",
                    "details": {"timeoutMs": timeout_ms},
                },
            )
        except StevoraError:
            raise  # a deliberate StepError: the driver records its code and retryable flag
        except Exception as exc:
            # A handler's own exception — whatever it is, even a database error of its own —
            # is this attempt's failure (the engine's database errors never reach here).
            log.warning(
                "task_handler_raised",
                workflow_run_id=ex.run_id,
                step_name=ex.step_name,
                attempt=ex.attempt,
                error=repr(exc),
                exc_info=exc,
            )
            return StepResult(status="failed", error=exception_error(exc))


def _paused_for(result: StepResult) -> StepResult:
    """A handler that returns `waiting` pauses the run for a signal (with `signalType`) or a timer."""
    if result.status != "waiting" or result.pause_reason is not None:
        return result
    return dataclasses.replace(
        result, pause_reason=PauseReason.EXTERNAL_EVENT if result.signal_type else PauseReason.WAIT
    )
