"""What a way to answer a tool call from outside the loop is: the protocol each awaited kind's
module implements, and registers in `stevora.engine.steps.awaited_kinds`.

The tool loop (`llm_tools`, `llm_tool_runner`) never names a kind: it asks the registry which
kind answers a tool (`answers`) or gates it (`gates`), lets that kind make the call's row
(`prepare`, or refuse the call at once), and builds its waiting result from the kinds' pause
reasons and details. The step type's `on_waiting` and `on_due` go through the registry too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from stevora.db.awaited import NewAwaitedCall
from stevora.definitions import LlmStep, LlmToolDef, ToolRef, WorkflowToolDef
from stevora.engine.steps.base import StepExecution, WaitContext, WaitPlan
from stevora.llm.messages import ToolSpec
from stevora.statuses import AwaitedKind, PauseReason
from stevora.tasks import StepResult
from stevora.tools import RegisteredTool, ToolOutcome

if TYPE_CHECKING:
    from stevora.runtime import Runtime

# A tool as the step declares it: inline, a workflow, or None (a registered tool named by reference).
ToolEntry = LlmToolDef | WorkflowToolDef | None


@dataclass(frozen=True, slots=True)
class Offered:
    """A tool a kind offers the model that no handler answers: the entry its calls are handed
    over with, and what the model sees."""

    entry: LlmToolDef | WorkflowToolDef
    spec: ToolSpec


@dataclass(frozen=True, slots=True)
class HandingOver:
    """One call the loop hands over, and what its kind may read to write its row."""

    rt: Runtime
    ex: StepExecution
    step: LlmStep
    tool: ToolEntry  # the step's entry for the called tool
    schema: dict[str, Any] | None  # the schema its arguments were checked against
    call: NewAwaitedCall  # its row as the loop made it (this kind's, no kind-specific fields)
    committed_at: datetime  # when the model call that asked for it was committed


class CallKind:
    """One way a tool call is answered from outside the loop. A subclass is one module's story:

    * what it writes when the loop hands a call over: `prepare` returns the call's row (or the
      failure the model gets at once, nothing handed over), `on_handed_over` writes
      what its calls need in the transaction that makes the step WAITING (child runs, webhooks,
      approval requests);
    * what its waiting means: `pause_reason` and `pause_detail` (the WORKFLOW_PAUSED details),
      and `on_due` when one of its calls has a deadline (`deadline_at`) that passed;
    * how it is answered: by its own answerer, which writes through `awaited.answer` (not part
      of this protocol: each kind's answer arrives through its own door: an API route, a child
      run's ending, a person's decision).
    """

    kind: ClassVar[AwaitedKind]
    pause_reason: ClassVar[PauseReason]
    # Which reason a step waiting for calls of several kinds gives (the lowest rank wins).
    pause_rank: ClassVar[int]
    details_key: ClassVar[str]  # the WORKFLOW_PAUSED details key listing this kind's calls
    has_deadlines: ClassVar[bool] = False  # whether `on_due` has anything to do

    def answers(self, tool: ToolEntry) -> bool:
        """Whether this kind answers every call of the step's tool `tool` (instead of a handler)."""
        return False

    async def offer(self, rt: Runtime, workspace_id: str, entry: ToolRef | WorkflowToolDef) -> Offered | None:
        """A tool this kind makes of a step's entry that names no registered handler (or is of
        this kind's own form), with the spec the model sees; None: not one of this kind's."""
        return None

    def gates(self, tool: ToolEntry, registered: RegisteredTool | None) -> bool:
        """Whether a handler tool's calls wait for this kind first, then run in the loop
        (`registered`: the worker's tool of that name)."""
        return False

    async def prepare(self, handing: HandingOver) -> NewAwaitedCall | ToolOutcome:
        """The call's row to write, with this kind's fields (a deadline, what to create with
        it); or the failure the model gets at once, and the call is not handed over."""
        return handing.call

    def pause_detail(self, call: NewAwaitedCall, tool: ToolEntry) -> dict[str, Any]:
        return {"id": call.tool_call_id, "name": call.tool_name}

    async def on_handed_over(
        self, wait: WaitContext, calls: list[NewAwaitedCall], inserted: set[str]
    ) -> WaitPlan:
        """Write what the calls recorded just now (`inserted`: a replayed round's are not) need,
        in the transaction that makes the step WAITING; returns what to write and dispatch with it."""
        return WaitPlan()

    async def on_due(self, wait: WaitContext) -> StepResult | None:
        """The waiting step's `wait_until` (the earliest deadline of its calls) passed. None: the
        kind moved the step (or it waits on)."""
        return None
