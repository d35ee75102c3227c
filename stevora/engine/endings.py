"""Every terminal transition of a run: completed, failed, cancelled.

Each function runs inside the caller's transaction and writes the run's final status, its event
and its webhook outbox row together. This is the one place a run ends, so it is also where a
run's ending is announced to whoever waits for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import structlog

from stevora.db import approvals, runs
from stevora.db.outbox import enqueue_webhooks
from stevora.db.runs import RELEASE
from stevora.events import Event, EventType, WebhookEvent
from stevora.statuses import ACTIVE_RUN_STATUSES, RunStatus

log = structlog.get_logger("stevora.engine")


async def complete_run(
    conn: asyncpg.Connection, run_id: str, *, owner: str, events: Sequence[Event] = ()
) -> asyncpg.Record:
    """RUNNING → COMPLETED. The run's output is its final state (documented in docs/concepts.md)."""
    final = await runs.update_run(
        conn,
        run_id,
        expect=[RunStatus.RUNNING],
        owner=owner,
        sets={"status": RunStatus.COMPLETED, "current_step_name": None, "next_run_at": None, **RELEASE},
        now_columns=["completed_at"],
        output_from_state=True,
        events=[*events, Event(EventType.WORKFLOW_COMPLETED, {})],
    )
    await enqueue_webhooks(
        conn,
        final["workspace_id"],
        WebhookEvent.WORKFLOW_COMPLETED,
        {
            "workflowRunId": run_id,
            "status": RunStatus.COMPLETED,
            "output": final["state"],
            "totalCostCents": final["total_cost_cents"],
        },
    )
    log.info("run_completed", workflow_run_id=run_id)
    return final


async def fail_run(
    conn: asyncpg.Connection,
    run_id: str,
    error: dict[str, Any],
    *,
    owner: str,
    events: Sequence[Event] = (),
) -> asyncpg.Record:
    """RUNNING → FAILED with `error` (retryable later by `commands.retry_run`)."""
    final = await runs.update_run(
        conn,
        run_id,
        expect=[RunStatus.RUNNING],
        owner=owner,
        sets={"status": RunStatus.FAILED, "error": error, "next_run_at": None, **RELEASE},
        now_columns=["failed_at"],
        events=[*events, Event(EventType.WORKFLOW_FAILED, {"error": error})],
    )
    await enqueue_webhooks(
        conn,
        final["workspace_id"],
        WebhookEvent.WORKFLOW_FAILED,
        {"workflowRunId": run_id, "status": RunStatus.FAILED, "error": error},
    )
    log.info("run_failed", workflow_run_id=run_id, code=error.get("code"))
    return final


async def cancel_run(conn: asyncpg.Connection, run_id: str) -> asyncpg.Record:
    """Any active status → CANCELLED; open steps and pending approvals are cancelled with it."""
    cancelled_steps = await runs.cancel_open_steps(conn, run_id)
    await approvals.cancel_for_run(conn, run_id)
    final = await runs.update_run(
        conn,
        run_id,
        expect=ACTIVE_RUN_STATUSES,
        sets={"status": RunStatus.CANCELLED, "next_run_at": None, **RELEASE},
        now_columns=["cancelled_at"],
        events=[Event(EventType.WORKFLOW_CANCELLED, {"cancelledStepRuns": cancelled_steps})],
    )
    await enqueue_webhooks(
        conn,
        final["workspace_id"],
        WebhookEvent.WORKFLOW_CANCELLED,
        {"workflowRunId": run_id, "status": RunStatus.CANCELLED},
    )
    log.info("run_cancelled", workflow_run_id=run_id)
    return final
