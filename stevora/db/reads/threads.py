"""Threads, their turns and the messages sent to their runs, as the API's thread routes read them
(sending a message is the engine's: `stevora.engine.threads`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stevora.db.reads.rows import Reader, Row, fetch, fetchrow, fetchval


@dataclass(frozen=True, slots=True)
class ThreadRow(Row):
    """A `threads` row, every column (the model names its `metadata` column `thread_metadata`)."""

    id: str
    workspace_id: str
    definition_id: str
    metadata: dict[str, Any]
    state: dict[str, Any]
    on_active: str
    forked_from_run_id: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class TurnRow(Row):
    """A turn of a thread: its run, oldest first."""

    id: str
    status: str
    input: dict[str, Any] | None
    error: dict[str, Any] | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RunMessageRow(Row):
    """A message sent to a running llm step (`steer`), with where it was injected."""

    id: str
    workflow_run_id: str
    content: str
    status: str
    step_name: str | None
    visit: int | None
    round: int | None
    created_at: datetime
    injected_at: datetime | None


_SELECT = f"SELECT {ThreadRow.columns()} FROM threads WHERE workspace_id = $1"


async def get(db: Reader, workspace_id: str, thread_id: str) -> ThreadRow | None:
    return ThreadRow.maybe(await fetchrow(db, f"{_SELECT} AND id = $2", workspace_id, thread_id))


async def listed(
    db: Reader, workspace_id: str, metadata: dict[str, str], *, offset: int, limit: int
) -> tuple[list[ThreadRow], int]:
    """Newest first, those whose metadata holds every `metadata` pair; (the page, the total)."""
    where = " AND metadata @> $2::jsonb" if metadata else ""
    args: list[Any] = [workspace_id, *([metadata] if metadata else [])]
    total: int = await fetchval(db, f"SELECT count(*) FROM threads WHERE workspace_id = $1{where}", *args)
    rows = await fetch(
        db,
        f"{_SELECT}{where} ORDER BY created_at DESC, id DESC OFFSET {int(offset)} LIMIT {int(limit)}",
        *args,
    )
    return ThreadRow.all(rows), total


async def turns(db: Reader, thread_id: str) -> list[TurnRow]:
    """The thread's turns, oldest first."""
    rows = await fetch(
        db,
        f"SELECT {TurnRow.columns()} FROM workflow_runs WHERE thread_id = $1 ORDER BY created_at, id",
        thread_id,
    )
    return TurnRow.all(rows)


async def run_messages(db: Reader, run_ids: list[str]) -> list[RunMessageRow]:
    """The messages sent to these runs, oldest first."""
    rows = await fetch(
        db,
        f"SELECT {RunMessageRow.columns()} FROM run_messages WHERE workflow_run_id = ANY($1::text[]) "
        "ORDER BY created_at, id",
        run_ids,
    )
    return RunMessageRow.all(rows)


async def latest_definition(db: Reader, workspace_id: str, name: str) -> str | None:
    """The id of the newest version of the workspace's definition `name` (derived versions left out)."""
    found: str | None = await fetchval(
        db,
        "SELECT id FROM workflow_definitions WHERE workspace_id = $1 AND name = $2 "
        "AND version NOT LIKE '%+fork-%' ORDER BY created_at DESC, id DESC LIMIT 1",
        workspace_id,
        name,
    )
    return found
