"""The ways a tool call is answered from outside the loop, registered: one line per kind.

A kind is one module: a `CallKind` subclass (stevora.engine.steps.awaited.kind) saying which
tools it answers or gates, what it writes when the loop hands a call over, what its waiting
means, and, beside it, the answerer that writes its results (`awaited.answer`). The tool loop and
the step types reach the kinds only through `AwaitedKinds` here: none of them names a kind.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from stevora.db import awaited as db_awaited
from stevora.db.awaited import NewAwaitedCall
from stevora.definitions import ToolRef, WorkflowToolDef
from stevora.engine.steps import approval
from stevora.engine.steps.awaited import client, workflow
from stevora.engine.steps.awaited.kind import CallKind, Offered, ToolEntry
from stevora.engine.steps.base import WaitContext, WaitPlan
from stevora.statuses import AwaitedKind
from stevora.tasks import StepResult
from stevora.tools import RegisteredTool

if TYPE_CHECKING:
    from stevora.runtime import Runtime


class AwaitedKinds:
    """The registered kinds, in the order their rows and webhooks are written."""

    def __init__(self, kinds: Iterable[CallKind]) -> None:
        self.kinds = tuple(kinds)
        self.by_kind: dict[AwaitedKind, CallKind] = {k.kind: k for k in self.kinds}
        self._due = tuple(k for k in self.kinds if k.has_deadlines)

    def answering(self, tool: ToolEntry) -> AwaitedKind | None:
        """The kind that answers every call of `tool`; None: a handler in the worker does."""
        return next((k.kind for k in self.kinds if k.answers(tool)), None)

    def gating(self, tool: ToolEntry, registered: RegisteredTool | None) -> AwaitedKind | None:
        """The kind a handler tool's calls wait for before they run; None: they run at once."""
        return next((k.kind for k in self.kinds if k.gates(tool, registered)), None)

    async def offer(self, rt: Runtime, workspace_id: str, entry: ToolRef | WorkflowToolDef) -> Offered | None:
        """The tool a kind makes of a step's entry that no handler answers; None: no kind does."""
        for kind in self.kinds:
            offered = await kind.offer(rt, workspace_id, entry)
            if offered is not None:
                return offered
        return None

    def waiting(self, handed: list[NewAwaitedCall], tools: dict[str, Any]) -> StepResult:
        """The waiting result of a step that handed `handed` over (`tools`: each call's tool entry
        by name): the earliest deadline, the pause reason of the highest-ranked kind, and each
        kind's calls in the pause details."""
        details: dict[str, Any] = {}
        reasons = []
        for kind in self.kinds:
            mine = [c for c in handed if c.kind == kind.kind]
            if mine:
                details[kind.details_key] = [kind.pause_detail(c, tools.get(c.tool_name)) for c in mine]
                reasons.append((kind.pause_rank, kind.pause_reason))
        deadlines = [c.deadline_at for c in handed if c.deadline_at is not None]
        return StepResult(
            status="waiting",
            wait_until=min(deadlines) if deadlines else None,
            pause_reason=min(reasons)[1] if reasons else None,
            pause_details=details,
            awaiting=handed,
        )

    async def hand_over(self, wait: WaitContext, result: StepResult) -> WaitPlan:
        """Record the calls a waiting step hands over (`result.awaiting`) and let each kind write
        what its calls need, in the transaction that makes the step WAITING; returns what to
        write and dispatch with the wait."""
        calls: list[NewAwaitedCall] = result.awaiting or []
        if not calls:  # a step waiting for something else (its run's budget to be raised)
            return WaitPlan()
        inserted = await db_awaited.insert(wait.conn, wait.run["id"], calls)
        plan = WaitPlan()
        for kind in self.kinds:
            mine = [call for call in calls if call.kind == kind.kind]
            if mine:
                plan += await kind.on_handed_over(wait, mine, inserted)
        return plan

    async def on_due(self, wait: WaitContext) -> StepResult | None:
        """The waiting step's earliest deadline passed: each kind with deadlines says what it means."""
        for kind in self._due:
            result = await kind.on_due(wait)
            if result is not None:
                return result
        return None


AWAITED_KINDS = AwaitedKinds(
    [
        workflow.KIND,
        client.KIND,
        approval.TOOL_CALL_KIND,
    ]
)
