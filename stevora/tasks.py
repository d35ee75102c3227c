"""Task handlers: `register_task_handler(name, fn)`, what a handler receives (`StepContext`) and what
every step type returns (`StepResult`)."""

from __future__ import annotations

import asyncio
import inspect
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from stevora.errors import StepError
from stevora.statuses import PauseReason


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a task handler knows about the step it runs in."""

    workflow_run_id: str
    workspace_id: str
    step_name: str
    step_run_id: str
    attempt: int
    workflow_input: Mapping[str, Any]
    workflow_state: Mapping[str, Any]
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        """Stable across re-executions of this attempt: use it to make side effects idempotent."""
        return f"{self.step_run_id}"

    # camelCase aliases, as the original SDK names them
    @property
    def workflowRunId(self) -> str:
        return self.workflow_run_id

    @property
    def workspaceId(self) -> str:
        return self.workspace_id

    @property
    def stepName(self) -> str:
        return self.step_name

    @property
    def workflowInput(self) -> Mapping[str, Any]:
        return self.workflow_input

    @property
    def workflowState(self) -> Mapping[str, Any]:
        return self.workflow_state


@dataclass(slots=True)
class StepResult:
    status: Literal["completed", "failed", "waiting"] = "completed"
    output: dict[str, Any] | None = None
    state_updates: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # {message, code?, details?}
    wait_until: datetime | None = None
    signal_type: str | None = None
    retryable: bool = True  # for failed results: may the RetryPolicy retry it?
    next_step: str | None = None  # the `__nextStep` directive (condition branching)
    # For waiting results: the WORKFLOW_PAUSED event's `reason` and any extra payload fields.
    pause_reason: PauseReason | None = None
    pause_details: dict[str, Any] | None = None
    # Engine-internal: what a waiting step hands over to be answered from outside (see
    # stevora.engine.steps.awaited); its step type's `on_waiting` records it.
    awaiting: list[Any] | None = None

    @classmethod
    def coerce(cls, value: Any) -> StepResult:
        """Accept a StepResult, a StepResult-shaped dict (`{"status": ..., "stateUpdates": ...}`),
        any other dict (taken as the output) or None (completed, no output)."""
        if isinstance(value, StepResult):
            return value
        if value is None:
            return cls()
        if isinstance(value, Mapping) and value.get("status") in ("completed", "failed", "waiting"):
            err = value.get("error")
            return cls(
                status=value["status"],
                output=value.get("output"),
                state_updates=value.get("stateUpdates", value.get("state_updates")),
                error=dict(err) if isinstance(err, Mapping) else ({"message": str(err)} if err else None),
                wait_until=value.get("waitUntil", value.get("wait_until")),
                signal_type=value.get("signalType", value.get("signal_type")),
                retryable=bool(value.get("retryable", True)),
                next_step=value.get("__nextStep"),
            )
        if isinstance(value, Mapping):
            return cls(output=dict(value))
        return cls(output={"result": value})


# Tracebacks are for people debugging the worker: kept in the logs and on the step's error
# (truncated), never in anything sent to a model.
MAX_STACK_CHARS = 4000


def exception_error(exc: BaseException) -> dict[str, Any]:
    """A step error for an unexpected exception: its type and message, and the traceback (`stack`)."""
    stack = "".join(traceback.format_exception(exc))
    if len(stack) > MAX_STACK_CHARS:
        stack = "... (truncated)\n" + stack[-MAX_STACK_CHARS:]
    return {"code": "STEP_FAILED", "message": f"{type(exc).__name__}: {exc}", "stack": stack}


TaskHandler = Callable[..., Awaitable[Any] | Any]


@dataclass(frozen=True, slots=True)
class RegisteredTask:
    name: str
    fn: TaskHandler
    is_async: bool
    arity: int  # 1: fn(ctx); 2: fn(ctx, step)


class TaskRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, RegisteredTask] = {}

    def register(self, name: str, fn: TaskHandler) -> TaskHandler:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        arity = 2 if len(params) >= 2 else 1
        self._handlers[name] = RegisteredTask(name, fn, inspect.iscoroutinefunction(fn), arity)
        return fn

    def handler(self, name: str | None = None) -> Callable[[TaskHandler], TaskHandler]:
        def deco(fn: TaskHandler) -> TaskHandler:
            return self.register(name or fn.__name__, fn)

        return deco

    def get(self, name: str) -> RegisteredTask | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def copy(self) -> TaskRegistry:
        other = TaskRegistry()
        other._handlers = dict(self._handlers)
        return other

    async def call(self, task: RegisteredTask, ctx: StepContext, step: Any) -> StepResult:
        args = (ctx, step) if task.arity == 2 else (ctx,)
        if task.is_async:
            value = await task.fn(*args)
        else:
            value = await asyncio.to_thread(task.fn, *args)
            if inspect.isawaitable(value):
                value = await value
        return StepResult.coerce(value)


# The process-level default that the public `register_task_handler` writes to. The runtime
# takes a registry explicitly (tests build their own); this is only the user-facing edge.
default_task_registry = TaskRegistry()


def register_task_handler(name: str, fn: TaskHandler) -> TaskHandler:
    """Register `fn(ctx, step)` as the handler named `name` (a task step's `handler`)."""
    return default_task_registry.register(name, fn)


def task_handler(name: str | None = None) -> Callable[[TaskHandler], TaskHandler]:
    """Decorator form of register_task_handler."""
    return default_task_registry.handler(name)


registerTaskHandler = register_task_handler

__all__ = [
    "RegisteredTask",
    "StepContext",
    "StepError",
    "StepResult",
    "TaskRegistry",
    "default_task_registry",
    "registerTaskHandler",
    "register_task_handler",
    "task_handler",
]
