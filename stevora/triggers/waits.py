"""Events answering waiting `external_event` steps (`event` + `match`).

Only runs waiting when the event arrives are looked at: an event that came before the step
started is not matched (it is not kept for later). Each candidate run is locked and answered
through `deliver_signal`, fenced by the run and its step being WAITING, so of two events matching
one run at once the first to lock it resumes it and the other finds it no longer waiting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import runs
from stevora.db import trigger_events as rows
from stevora.db.reads.rows import DbRow
from stevora.definitions import ExternalEventStep
from stevora.definitions.steps import EVENT_SIGNAL_PREFIX
from stevora.engine.steps.external_event import deliver_signal
from stevora.errors import StevoraError
from stevora.triggers import expressions

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.triggers")


async def resume_waiting(rt: Runtime, conn: asyncpg.Connection, event: DbRow) -> list[str]:
    """Resume the runs waiting for this event whose `match` holds; their ids (dispatch after commit)."""
    signal = EVENT_SIGNAL_PREFIX + event["name"]
    context = expressions.event_context(event)
    resumed: list[str] = []
    for waiting in await rows.runs_waiting_for(conn, event["workspace_id"], signal):
        spec = await rt.definitions.get_in_workspace(event["workspace_id"], waiting["definition_id"])
        step = spec.step(waiting["step_name"]) if spec is not None else None
        if not isinstance(step, ExternalEventStep):
            continue
        scope: dict[str, Any] = {**context, "input": waiting["input"], "state": waiting["state"]}
        if step.match is not None and not expressions.holds(step.match, scope):
            continue
        data = context["data"]
        payload = dict(data) if isinstance(data, dict) else {"data": data}
        try:
            async with conn.transaction():  # a savepoint: a run that moved on is skipped
                run = await runs.lock_run(conn, waiting["id"])
                if run is None:
                    continue
                await deliver_signal(conn, rt.settings, run, signal, payload, output=payload)
                await rows.add_event_run(conn, event["id"], run["id"], "resumed")
        except StevoraError as exc:
            log.info("event_wait_not_answered", workflow_run_id=waiting["id"], reason=exc.message)
            continue
        resumed.append(str(waiting["id"]))
    return resumed
