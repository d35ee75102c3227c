"""A definition's `schedule` and `triggers`, kept in step with the newest version of its name.

Storing a version replaces what the previous one declared (one transaction): its event triggers,
and the schedule named after the definition (made, changed, or deleted when the new version has
no `schedule`). So `stevora definitions apply` of an edited file keeps both in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stevora.db import trigger_events
from stevora.definitions import WorkflowDefinitionSpec
from stevora.triggers import schedule_store

if TYPE_CHECKING:
    from stevora.runtime import Runtime


async def sync(rt: Runtime, workspace_id: str, definition_id: str, spec: WorkflowDefinitionSpec) -> None:
    triggers = [
        (t.event, t.model_dump(by_alias=True, exclude_none=True, mode="json")) for t in spec.triggers or []
    ]
    async with rt.pool.acquire() as conn, conn.transaction():
        await trigger_events.replace_triggers(conn, workspace_id, spec.name, definition_id, triggers)
        await schedule_store.sync_from_definition(conn, workspace_id, spec.name, spec.schedule)
