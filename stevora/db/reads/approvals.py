"""Approval requests, as the API's approval routes and the UI's approvals page and run page read
them (deciding one is the engine's: `stevora.engine.steps.approval`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from stevora.db.reads.rows import Reader, Row, fetch, fetchrow, fetchval
from stevora.statuses import ApprovalStatus


@dataclass(frozen=True, slots=True)
class ApprovalRow(Row):
    """An `approval_requests` row, every column."""

    table: ClassVar[str] = "approval_requests"
    table_alias: ClassVar[str] = "a"

    id: str
    workspace_id: str
    workflow_run_id: str
    step_run_id: str
    awaited_tool_call_id: str | None
    step_name: str
    content_key: str
    content: Any
    prompt: str | None
    status: str
    decision: str | None
    edited_content: Any
    decided_by: str | None
    decided_at: datetime | None
    expires_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ApprovalWithRun(ApprovalRow):
    """A request with its run's status and definition (the UI's approvals page)."""

    run_status: str
    definition_id: str
    definition_name: str
    definition_version: str


_PENDING = f"'{ApprovalStatus.PENDING}'"
_SELECT = f"SELECT {ApprovalRow.columns('')} FROM approval_requests WHERE workspace_id = $1"
_NEWEST_FIRST = "ORDER BY created_at DESC, id DESC"


async def listed(db: Reader, workspace_id: str, pending: bool | None, limit: int) -> list[ApprovalRow]:
    """Newest first; `pending`: True awaiting a decision, False decided/expired/cancelled."""
    status = {None: "", True: f" AND status = {_PENDING}", False: f" AND status <> {_PENDING}"}[pending]
    rows = await fetch(db, f"{_SELECT}{status} {_NEWEST_FIRST} LIMIT {int(limit)}", workspace_id)
    return ApprovalRow.all(rows)


async def get(db: Reader, workspace_id: str, approval_id: str) -> ApprovalRow | None:
    return ApprovalRow.maybe(await fetchrow(db, f"{_SELECT} AND id = $2", workspace_id, approval_id))


_WITH_RUN = (
    f"SELECT {ApprovalRow.columns()}, r.status AS run_status, r.definition_id, "
    "d.name AS definition_name, d.version AS definition_version "
    "FROM approval_requests a JOIN workflow_runs r ON r.id = a.workflow_run_id "
    "JOIN workflow_definitions d ON d.id = r.definition_id WHERE a.workspace_id = $1 "
)


async def to_work_through(
    db: Reader, workspace_id: str
) -> tuple[list[ApprovalWithRun], list[ApprovalWithRun]]:
    """Pending requests (oldest first, the order to work through them) and the 10 latest decided."""
    pending = await fetch(db, _WITH_RUN + f"AND a.status = {_PENDING} ORDER BY a.created_at", workspace_id)
    decided = await fetch(
        db, _WITH_RUN + f"AND a.status <> {_PENDING} ORDER BY a.updated_at DESC LIMIT 10", workspace_id
    )
    return ApprovalWithRun.all(pending), ApprovalWithRun.all(decided)


@dataclass(frozen=True, slots=True)
class CallApproval(Row):
    """A pending request gating a tool call: its id and the call's id."""

    id: str
    tool_call_id: str


async def gating_calls(db: Reader, run_id: str) -> list[CallApproval]:
    """The run's pending approval requests that gate tool calls."""
    rows = await fetch(
        db,
        "SELECT a.id, c.tool_call_id FROM approval_requests a "
        "JOIN awaited_tool_calls c ON c.id = a.awaited_tool_call_id "
        f"WHERE a.workflow_run_id = $1 AND a.status = {_PENDING}",
        run_id,
    )
    return CallApproval.all(rows)


@dataclass(frozen=True, slots=True)
class RunApproval(Row):
    """A pending request of a run: its id, step, and the gated call's tool name and id when a tool
    call is what is approved."""

    id: str
    step_name: str
    tool_name: str | None
    tool_call_id: str | None


async def pending_of_run(db: Reader, run_id: str) -> list[RunApproval]:
    """The run's pending approval requests, oldest first (the run page's call to action)."""
    rows = await fetch(
        db,
        "SELECT a.id, a.step_name, c.tool_name, c.tool_call_id FROM approval_requests a "
        "LEFT JOIN awaited_tool_calls c ON c.id = a.awaited_tool_call_id "
        f"WHERE a.workflow_run_id = $1 AND a.status = {_PENDING} ORDER BY a.created_at",
        run_id,
    )
    return RunApproval.all(rows)


async def pending_count(db: Reader, workspace_id: str) -> int:
    total: int = await fetchval(
        db,
        f"SELECT count(*) FROM approval_requests WHERE workspace_id = $1 AND status = {_PENDING}",
        workspace_id,
    )
    return total


async def run_of(db: Reader, workspace_id: str, approval_id: str) -> str | None:
    run_id: str | None = await fetchval(
        db,
        "SELECT workflow_run_id FROM approval_requests WHERE id = $1 AND workspace_id = $2",
        approval_id,
        workspace_id,
    )
    return run_id
