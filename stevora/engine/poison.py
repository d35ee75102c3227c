"""Poison runs end: a run whose driver keeps crashing is FAILED with RUN_CRASH_LIMIT.

`workflow_runs.crash_count` counts consecutive crashes durably: the run pool adds one when the
driver raises (`record_crash`), the claim adds one when it takes over a lease that expired (the
worker holding the run died, or hung, or crashed while decoding it: `transitions.claim`). Every
lease-fenced run transition (a step starting, ending, waiting or retrying; see
`runs.update_run`) sets it back to 0, so only crashes with no progress in between add up, and the
tool loop's checkpoints pay nothing for it. At `STEVORA_MAX_RUN_CRASHES` the run fails instead
of being driven again; `retry` starts the count over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from stevora.db import approvals, runs
from stevora.engine import endings
from stevora.errors import InvalidStateTransition, LeaseLost, RunCrashLimit
from stevora.events import step_failed
from stevora.statuses import OPEN_STEP_STATUSES, RunStatus, StepStatus

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.worker")


async def record_crash(rt: Runtime, run_id: str, owner: str) -> int | None:
    """Count one crash of a run this worker holds; the new count (None: the lease is gone)."""
    return await runs.count_crash(rt.pool, run_id, owner)


def crash_error(crashes: int, limit: int) -> dict[str, Any]:
    err = RunCrashLimit(
        f"The run's driver crashed (or the worker holding it died) {crashes} times in a row without "
        f"progress (STEVORA_MAX_RUN_CRASHES={limit}); see the worker logs for 'run_driver_crashed'. "
        "Retry the run once the cause is fixed.",
        details={"crashes": crashes, "limit": limit},
    )
    return {**err.to_dict(), "retryable": False}


async def fail_crashed(rt: Runtime, run_id: str, owner: str, crashes: int) -> bool:
    """FAIL a run this worker holds with RUN_CRASH_LIMIT (its open step too); False when the run
    was no longer this worker's (or no longer active) — nothing is written then."""
    error = crash_error(crashes, rt.settings.max_run_crashes)
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await runs.lock_run(conn, run_id)
        if run is None or run["lease_owner"] != owner:
            return False
        events = []
        if run["current_step_run_id"] is not None:
            step = await runs.get_step_run(conn, run["current_step_run_id"])
            if step is not None and step["status"] in OPEN_STEP_STATUSES:
                await runs.update_step(
                    conn,
                    step["id"],
                    expect=list(OPEN_STEP_STATUSES),
                    sets={"status": StepStatus.FAILED, "error": error},
                    now_columns=["completed_at"],
                )
                events.append(step_failed(step, error))
        await approvals.cancel_for_run(conn, run_id)
        try:
            ended = await endings.fail_run(
                conn,
                run_id,
                {**error, "stepName": run["current_step_name"]},
                owner=owner,
                events=events,
                expect=(RunStatus.RUNNING, RunStatus.WAITING),
            )
        except (LeaseLost, InvalidStateTransition):
            return False
    log.warning("run_crash_limit", workflow_run_id=run_id, crashes=crashes)
    await endings.after_commit(rt, ended)
    return True
