"""Server-sent events for the run page, authenticated by the UI cookie.

`EventSource` cannot send an `x-api-key` header, so the UI has its own stream with the same
wire format as `/v1/workflow-runs/{id}/events/stream`: `id: <sequence>`, `event: <eventType>`,
`data: <event JSON>`. It polls PostgreSQL for events after the last sequence sent and ends
(with a final `event: end`) once the run is terminal, so a finished page holds no connection.
Streamed model calls' text arrives between events as id-less `event: llm.text.delta` messages.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from stevora.clock import iso
from stevora.events import EventType
from stevora.live import delta_sse, deltas_for, drain
from stevora.statuses import TERMINAL_RUN_STATUSES, values
from stevora.ui import queries

if TYPE_CHECKING:
    from stevora.db.reads.events import EventRow
    from stevora.runtime import Runtime

POLL_S = 0.3
HEARTBEAT_S = 15.0

# Named SSE events only reach listeners registered for their name, so the page needs the list.
EVENT_TYPES = values(EventType)


def event_json(run_id: str, row: EventRow) -> dict[str, Any]:
    return {
        "id": row["id"],
        "workflowRunId": run_id,
        "stepRunId": row["step_run_id"],
        "sequence": row["sequence"],
        "eventType": row["event_type"],
        "payload": row["payload"],
        "createdAt": iso(row["created_at"]),
    }


def sse_message(event_id: int | None, event: str, data: Any) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


async def run_events(
    rt: Runtime,
    workspace_id: str,
    run_id: str,
    after: int,
    *,
    poll_s: float = POLL_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> AsyncIterator[str]:
    """Every event with `sequence > after`, as it is written, until the run is terminal; between
    them, streamed model calls' text as `llm.text.delta` messages (no id, ephemeral)."""
    last = after
    quiet_s = 0.0
    async with rt.live.subscribe(run_id) as deltas:
        while True:
            for delta in drain(deltas):  # published before the events read next
                yield delta_sse(delta)
            rows = await queries.events_after(rt, run_id, last)
            for row in rows:
                last = row["sequence"]
                yield sse_message(last, row["event_type"], event_json(run_id, row))
            if rows:
                quiet_s = 0.0
                continue  # drain a backlog before sleeping
            status = await queries.run_status(rt, workspace_id, run_id)
            if status is None or status in TERMINAL_RUN_STATUSES:
                # Events are committed with the status change, but may have landed between our two reads.
                for row in await queries.events_after(rt, run_id, last):
                    last = row["sequence"]
                    yield sse_message(last, row["event_type"], event_json(run_id, row))
                yield sse_message(None, "end", {"status": status, "lastSequence": last})
                return
            async for delta in deltas_for(deltas, poll_s):  # instead of sleeping
                yield delta_sse(delta)
            quiet_s += poll_s
            if quiet_s >= heartbeat_s:
                quiet_s = 0.0
                yield ": keep-alive\n\n"
