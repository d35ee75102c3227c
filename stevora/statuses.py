"""Run, step and approval statuses, and the reasons and kinds of a wait: the one catalogue used by
the engine, the API, the UI, the CLI and the client.

Stored as text with a CHECK constraint (stevora.db.models) and sent as the documented UPPERCASE
strings. `StrEnum` members *are* those strings, so they compare equal to what the database and the
wire carry. This module imports nothing from Stevora, so the client can use it on its own.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class StepStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    CANCELLED = "CANCELLED"


class ApprovalStatus(StrEnum):
    PENDING = "PENDING"
    DECIDED = "DECIDED"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"


class ApprovalDecision(StrEnum):
    """What a person decided on an approval request (`approval_requests.decision`)."""

    APPROVED = "approved"
    REJECTED = "rejected"
    EDITED = "edited"  # approved with `editedContent` in place of the content (or the call's arguments)


class PauseReason(StrEnum):
    """Why a run stopped running: `WORKFLOW_PAUSED`'s `reason`."""

    WAIT = "wait"  # a timer (`wait` step)
    EXTERNAL_EVENT = "external_event"  # a signal (`external_event` step, or a task handler's wait)
    APPROVAL = "approval"  # a person's decision on an `approval` step
    TOOL_OUTPUTS = "tool_outputs"  # client-executed tool calls (and maybe others) are out
    TOOL_APPROVAL = "tool_approval"  # approval-gated tool calls (and maybe child runs) are out
    CHILD_RUNS = "child_runs"  # only workflow tool calls are out
    MANUAL = "manual"  # the pause command
    BUDGET = "budget"  # a limit of the run's budget, with `onBudgetExceeded: "pause"`
    MAP = "map"  # a `map` step's child runs are out


class ResumeReason(StrEnum):
    """Why a run went back to running: `WORKFLOW_RESUMED`'s `reason`."""

    TIMER = "timer"  # a due wait completed its step
    RETRY = "retry"  # the retry command
    MANUAL = "manual"  # the resume command on a paused run
    SIGNAL = "signal"
    APPROVAL = "approval"  # a decision on an approval step or an approval-gated tool call
    TOOL_OUTPUTS = "tool_outputs"
    CHILD_RUN = "child_run"
    TOOL_OUTPUT_TIMEOUT = "tool_output_timeout"
    BUDGET = "budget"  # the budget was raised
    MAP = "map"  # every child run of a `map` step ended (or its first failure, with `onItemFailure: "fail"`)


class AwaitedKind(StrEnum):
    """Who answers a tool call handed over by a waiting step (`awaited_tool_calls.kind`)."""

    CLIENT = "client"  # the API caller (`"execution": "client"`)
    WORKFLOW = "workflow"  # a child run
    APPROVAL = "approval"  # a person approves the call, then the step runs it


class AwaitedStatus(StrEnum):
    """`awaited_tool_calls.status`."""

    PENDING = "pending"
    APPROVED = "approved"  # approval-gated: the resumed step runs it with the approved arguments
    ANSWERED = "answered"  # its tool_trace row is written


class AnsweredBy(StrEnum):
    """Who wrote an awaited call's result: `TOOL_CALL_*`'s `answeredBy`."""

    CLIENT = "client"
    WORKFLOW = "workflow"
    TIMEOUT = "timeout"
    PERSON = "person"


class MapItemStatus(StrEnum):
    """`map_items.status`: one element of a `map` step's items."""

    PENDING = "pending"  # not started yet (waits for a free slot)
    RUNNING = "running"  # its child run is out
    COMPLETED = "completed"
    FAILED = "failed"  # its child run failed
    CANCELLED = "cancelled"  # its child run was cancelled


TERMINAL_RUN_STATUSES: frozenset[RunStatus] = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
)
# Runs a command may still act on (cancel), i.e. not finished.
ACTIVE_RUN_STATUSES: tuple[RunStatus, ...] = (
    RunStatus.PENDING,
    RunStatus.RUNNING,
    RunStatus.WAITING,
    RunStatus.PAUSED,
)
# Runs a worker may hold a lease on (claim, heartbeat, sweep).
LEASABLE_RUN_STATUSES: tuple[RunStatus, ...] = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)
OPEN_STEP_STATUSES: tuple[StepStatus, ...] = (StepStatus.PENDING, StepStatus.RUNNING, StepStatus.WAITING)

# Transition tables, exactly as docs/state-machines.md draws them. The guarded updates only ever
# move rows along these edges: tests/unit/test_transitions.py checks every `update_run` /
# `update_step` of the engine against them.
RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.PENDING: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.WAITING, RunStatus.PAUSED, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
    RunStatus.WAITING: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.PAUSED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset({RunStatus.RUNNING}),
    RunStatus.CANCELLED: frozenset(),
}
STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    StepStatus.PENDING: frozenset(
        {StepStatus.RUNNING, StepStatus.SKIPPED, StepStatus.FAILED, StepStatus.CANCELLED}
    ),
    StepStatus.RUNNING: frozenset(
        {StepStatus.WAITING, StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.CANCELLED}
    ),
    StepStatus.WAITING: frozenset(
        {StepStatus.RUNNING, StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.CANCELLED}
    ),
    StepStatus.COMPLETED: frozenset(),
    StepStatus.FAILED: frozenset({StepStatus.RUNNING}),
    StepStatus.SKIPPED: frozenset(),
    StepStatus.CANCELLED: frozenset(),
}


def values(statuses: type[StrEnum]) -> tuple[str, ...]:
    """The plain string values of an enum, in declaration order (for CHECK constraints, Literals)."""
    return tuple(member.value for member in statuses)
