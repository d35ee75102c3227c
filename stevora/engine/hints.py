"""Dispatching after a commit: the message is a hint, so failing to send it fails nothing.

The run is already committed with `dispatched_at` set; if the broker is down (a RabbitMQ
restart, Redis unreachable) the recovery sweep dispatches it once the grace period is over. So
a publish error after a commit is logged, never raised: an API client whose run was created
must get 201, not a 500 that invites it to create the run again.
"""

from __future__ import annotations

import structlog

from stevora.engine.dispatch import Dispatcher

log = structlog.get_logger("stevora.engine")


async def dispatch_hint(dispatcher: Dispatcher, run_id: str, *, delay_ms: int = 0) -> bool:
    """Send the wake-up for `run_id`; False (logged) when the broker refused it."""
    try:
        await dispatcher.dispatch(run_id, delay_ms=delay_ms)
    except Exception as exc:
        log.warning(
            "dispatch_failed_sweep_will_retry",
            workflow_run_id=run_id,
            delay_ms=delay_ms,
            error=f"{type(exc).__name__}: {exc}",
        )
        return False
    return True


async def dispatch_hints(dispatcher: Dispatcher, run_ids: list[str]) -> None:
    """Wake-ups for many runs: in one call to the broker when the dispatcher sends in bulk
    (`dispatch_many`), else one by one; a refusal is logged (the sweep re-dispatches)."""
    if not run_ids:
        return
    many = getattr(dispatcher, "dispatch_many", None)
    if many is None:
        for run_id in run_ids:
            await dispatch_hint(dispatcher, run_id)
        return
    try:
        await many(run_ids)
    except Exception as exc:
        log.warning(
            "dispatch_failed_sweep_will_retry", runs=len(run_ids), error=f"{type(exc).__name__}: {exc}"
        )
