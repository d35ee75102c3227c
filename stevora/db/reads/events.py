"""A run's events (`workflow_events`): the API's pages and streams and the UI's run page and stream
read them here. Sequences are gap-free 1..N per run, so a page is a sequence range read straight
off the (workflow_run_id, sequence) unique index."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stevora.db.reads.rows import Reader, Row, fetch, fetchval


@dataclass(frozen=True, slots=True)
class EventRow(Row):
    id: str
    workflow_run_id: str
    step_run_id: str | None
    sequence: int
    event_type: str
    payload: dict[str, Any]
    created_at: datetime


_COLUMNS = EventRow.columns()
_AFTER = f"SELECT {_COLUMNS} FROM workflow_events WHERE workflow_run_id = $1 AND sequence > $2"


async def after(
    db: Reader, run_id: str, after: int, *, until: int | None = None, limit: int | None = None
) -> list[EventRow]:
    """Events with `after < sequence` (and `<= until`), in order, at most `limit`."""
    if until is None:
        sql = f"{_AFTER} ORDER BY sequence"
        args: tuple[Any, ...] = (run_id, after)
    else:
        sql = f"{_AFTER} AND sequence <= $3 ORDER BY sequence"
        args = (run_id, after, until)
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return EventRow.all(await fetch(db, sql, *args))


async def latest(db: Reader, run_id: str, count: int) -> list[EventRow]:
    """The run's last `count` events, oldest first."""
    rows = await fetch(
        db,
        f"SELECT * FROM (SELECT {_COLUMNS} FROM workflow_events WHERE workflow_run_id = $1 "
        f"ORDER BY sequence DESC LIMIT {int(count)}) e ORDER BY sequence",
        run_id,
    )
    return EventRow.all(rows)


async def count(db: Reader, run_id: str) -> int:
    total: int = await fetchval(db, "SELECT count(*) FROM workflow_events WHERE workflow_run_id = $1", run_id)
    return total
