"""Starting a run from events (a trigger, a debounce group, a batch): its input, and the run
inserted in the caller's transaction with the rows that name it on its events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.db import trigger_events as rows
from stevora.definitions.triggers import EventTrigger
from stevora.engine import commands
from stevora.errors import ValidationError
from stevora.observability.metrics import TRIGGER_RUNS_STARTED
from stevora.templating import MissingTemplatePath, render_typed

if TYPE_CHECKING:
    from stevora.runtime import Runtime


def run_input(spec: EventTrigger, context: dict[str, Any]) -> dict[str, Any]:
    """The trigger's `input` templated with `{{event.x}}`, else the event's data."""
    if spec.input is None:
        data = context["data"]
        return dict(data) if isinstance(data, dict) else {"data": data}
    try:
        rendered = render_typed(
            spec.input, input={}, state={}, scope={"event": context}, field="triggers.input"
        )
    except MissingTemplatePath as exc:
        raise ValidationError.from_problems([{"path": exc.field, "message": str(exc)}]) from None
    return dict(rendered)


async def start_run(
    rt: Runtime,
    conn: asyncpg.Connection,
    *,
    workspace_id: str,
    definition_id: str,
    run_input: dict[str, Any],
    key: str,
    event_ids: list[str],
) -> str | None:
    """Insert a triggered run in the caller's transaction and name it on its events; its id when
    it is new (the caller dispatches after commit), None when the key had already started it."""
    run, created = await commands.create_run(
        rt, workspace_id, definition_id, run_input, idempotency_key=key, conn=conn
    )
    for event_id in event_ids:
        await rows.add_event_run(conn, event_id, run["id"], "started")
    if not created:
        return None
    TRIGGER_RUNS_STARTED.labels("event").inc()
    return str(run["id"])
