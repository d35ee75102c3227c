"""What every part of the run driver shares: the lease owner and runtime, the `Position` a pass
goes on from, handing a run back, and dispatching after commit. The driver's transitions are split
by concern over `advancing` (a completed step and what follows it), `waiting` (a step going
WAITING and a due wait) and `retrying` (a failed attempt: retry or fail the run); `driver` drives
the passes and executes the steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.clock import utcnow
from stevora.db import runs
from stevora.db.reads.rows import DbRow
from stevora.events import Event, EventType

if TYPE_CHECKING:
    from stevora.runtime import Runtime

# Timers fire a little late rather than early: an early message finds the run not yet due.
TIMER_SLACK_MS = 10


def delay_until(when: datetime) -> int:
    return max(0, math.ceil((when - utcnow()).total_seconds() * 1000)) + TIMER_SLACK_MS


@dataclass(frozen=True, slots=True)
class Position:
    """Where a run stands after a transition this driver committed: the rows its statement returned.

    The next pass takes them instead of re-reading the run and its step run. That is safe because
    while this driver holds the lease nothing else moves the run without the next write noticing:
    every write of the driver and of the step's checkpoints is fenced by `lease_owner` and an
    expected status, and a cancel (releases the lease), a pause (run leaves RUNNING) or a
    takeover (new owner) all break that fence, so a stale row is never acted on — the write finds
    zero rows and the pass ends with LeaseLost / InvalidStateTransition instead. The only window
    is a step starting just after such a change, as wide as it was with a fresh read. Transitions
    whose effects their rows do not show (a wait, a due check, a retry) return True instead, and
    the next pass reads again.
    """

    run: DbRow
    step_run: Any = None  # None: read the run's current step run
    # This driver just started this step run, attempt 1 of a new visit: it has no committed rounds.
    fresh: bool = False


# What a pass returns: False = this worker is done with the run; True = go on, reading the run
# again; a Position = go on from these rows.
Next = Position | bool


class DriverCore:
    """The state every part of the driver works with."""

    def __init__(self, rt: Runtime, owner: str) -> None:
        self.rt = rt
        self.owner = owner
        self.pool: asyncpg.Pool = rt.pool

    async def release(self, run_id: str) -> None:
        await runs.release(self.pool, run_id, self.owner)


def step_started(step_run: Any) -> Event:
    return Event(
        EventType.STEP_STARTED,
        {
            "stepName": step_run["step_name"],
            "stepType": step_run["step_type"],
            "attempt": step_run["attempt"],
            "visit": step_run["visit"],
        },
        step_run["id"],
    )
