"""What a step type is to the driver: how to execute it, what to write when it starts waiting,
and what happens when its wait is due.

A step type speaks back through values: `execute` returns a StepResult, `on_waiting` a WaitPlan
(what to write and dispatch with the wait), `on_due` a StepResult or None. None of them changes
what it was handed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import asyncpg

from stevora.clock import iso
from stevora.db.checkpoints import Inbox
from stevora.db.reads.rows import DbRow
from stevora.events import Event
from stevora.tasks import StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime


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
    # Started by this very pass as attempt 1 of a new visit: no rounds or traces can exist yet,
    # so a step that resumes from checkpoints (llm) need not load them.
    fresh: bool = False
    # The run's budget as the driver read it (None: no limit, and nothing is read or checked).
    budget: dict[str, Any] | None = None
    # Set on a thread turn's conversation step (its first `llm` step, first visit): the thread
    # whose history the step continues and whose id is its prompt-cache key (docs/threads.md).
    thread_id: str | None = None
    # Whether messages sent to the run may wait for this step (steering): from the row of the
    # transition that started this execution, then from each checkpoint's (stevora.db.checkpoints).
    inbox: Inbox = field(default_factory=Inbox)
    # (replay_of, replay_tools) of the run when the row this pass started from carries them (the
    # claim returns them): whether its tool calls are answered from a recording, without a read.
    replay: tuple[str | None, str | None] | None = None


@dataclass(frozen=True, slots=True)
class WaitContext:
    """A step run that is entering, or sits in, WAITING; `conn` is inside the driver's transaction."""

    conn: asyncpg.Connection
    rt: Runtime
    run: DbRow
    step_run: DbRow
    step: Any  # the step's definition model
    owner: str  # the driver's lease


@dataclass(frozen=True, slots=True)
class WaitPlan:
    """What a step type wants done as its step goes WAITING, besides the rows it wrote in the
    wait's transaction: events written with the wait (before WORKFLOW_PAUSED), fields added to the
    WORKFLOW_PAUSED event, and runs to dispatch once the transaction has committed (e.g. child
    runs it created)."""

    events: tuple[Event, ...] = ()
    pause_details: Mapping[str, Any] = field(default_factory=dict)
    dispatch: tuple[str, ...] = ()

    def __add__(self, other: WaitPlan) -> WaitPlan:
        return WaitPlan(
            events=self.events + other.events,
            pause_details={**self.pause_details, **other.pause_details},
            dispatch=self.dispatch + other.dispatch,
        )


class StepType:
    """Base of every step type. Subclasses set `name` and implement `execute`.

    `execute` returns a StepResult and touches no run or step rows: the driver records it. A step
    that checkpoints inside its execution (the `llm` loop) does so through stevora.db, fenced by
    the lease in `StepExecution.owner`.
    """

    name: ClassVar[str]
    # What a timed-out wait was waiting for, in "No <waits_for> received before ...".
    waits_for: ClassVar[str] = "signal"

    async def execute(self, rt: Runtime, ex: StepExecution, step: Any) -> StepResult:
        raise NotImplementedError

    async def on_waiting(self, wait: WaitContext, result: StepResult) -> WaitPlan:
        """Write the rows the wait needs (in the driver's transaction that makes the step WAITING);
        returns what else to write and dispatch with it."""
        return WaitPlan()

    async def on_due(self, wait: WaitContext) -> StepResult | None:
        """The step's `wait_until` passed: by default the wait timed out (TIMEOUT, retryable).

        A completed or failed result is recorded by the driver. None means the step type moved
        the step itself (it resumed, or waits on with a new `wait_until`): the driver looks again.
        """
        due = wait.step_run["wait_until"]
        return StepResult(
            status="failed",
            error={
                "code": "TIMEOUT",
                "retryable": True,
                "message": f"No {self.waits_for} received before {iso(due)}",
            },
        )
