"""The awaited kinds by name, and handing a waiting step's calls over to them.

A new kind of awaited call is one module (what it writes when handed over, what its due wait
means, how it is answered) registered here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from stevora.db import awaited as db_awaited
from stevora.db.awaited import NewAwaitedCall
from stevora.engine.steps import approval
from stevora.engine.steps.awaited import client, workflow
from stevora.engine.steps.base import WaitContext, WaitPlan
from stevora.statuses import AwaitedKind
from stevora.tasks import StepResult

HandOver = Callable[[WaitContext, list[NewAwaitedCall], set[str]], Awaitable[WaitPlan]]

# In the order their rows and webhooks are written.
HANDED_OVER: dict[AwaitedKind, HandOver] = {
    AwaitedKind.WORKFLOW: workflow.on_handed_over,
    AwaitedKind.CLIENT: client.on_handed_over,
    AwaitedKind.APPROVAL: approval.on_tool_calls_handed_over,
}


async def hand_over(wait: WaitContext, result: StepResult) -> WaitPlan:
    """Record the calls a waiting step hands over (`result.awaiting`) and let each kind write what
    its calls need, in the transaction that makes the step WAITING; returns what to write and
    dispatch with the wait."""
    calls: list[NewAwaitedCall] = result.awaiting or []
    if not calls:  # a step waiting for something else (its run's budget to be raised)
        return WaitPlan()
    inserted = await db_awaited.insert(wait.conn, wait.run["id"], calls)
    plan = WaitPlan()
    for kind, on_handed_over in HANDED_OVER.items():
        mine = [call for call in calls if call.kind == kind]
        if mine:
            plan += await on_handed_over(wait, mine, inserted)
    return plan
