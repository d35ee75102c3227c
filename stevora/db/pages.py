"""The UI pages' reads (`stevora.ui.queries` assembles its read models from them): raw asyncpg
statements, every one scoped to one workspace (a run's own rows are reached through a run of it)."""

from __future__ import annotations

from typing import TypeAlias

import asyncpg

from stevora.statuses import ApprovalStatus

Reader: TypeAlias = asyncpg.Connection | asyncpg.Pool

_RUNS_JOIN = "workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id"
_RUN_LIST_COLUMNS = (
    "r.id, r.status, r.current_step_name, r.created_at, r.started_at, r.completed_at, r.failed_at, "
    "r.cancelled_at, r.total_cost_cents, r.total_input_tokens, r.total_output_tokens, r.definition_id, "
    "d.name AS definition_name, d.version AS definition_version, r.concurrency_key, r.queued_at"
)


async def definition_choices(db: Reader, workspace_id: str) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            "SELECT id, name, version FROM workflow_definitions WHERE workspace_id = $1 "
            "ORDER BY name, created_at",
            workspace_id,
        )
    )


_APPROVALS = (
    "SELECT a.*, r.status AS run_status, r.definition_id, "
    "d.name AS definition_name, d.version AS definition_version "
    "FROM approval_requests a JOIN workflow_runs r ON r.id = a.workflow_run_id "
    "JOIN workflow_definitions d ON d.id = r.definition_id WHERE a.workspace_id = $1 "
)


async def approvals(db: Reader, workspace_id: str) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    """Pending requests (oldest first, the order to work through them) and the 10 latest decided."""
    pending = await db.fetch(
        _APPROVALS + f"AND a.status = '{ApprovalStatus.PENDING}' ORDER BY a.created_at", workspace_id
    )
    decided = await db.fetch(
        _APPROVALS + f"AND a.status <> '{ApprovalStatus.PENDING}' ORDER BY a.updated_at DESC LIMIT 10",
        workspace_id,
    )
    return list(pending), list(decided)


async def pending_call_approvals(db: Reader, run_id: str) -> list[asyncpg.Record]:
    """The run's pending approval requests that gate tool calls: (request id, the call's id)."""
    return list(
        await db.fetch(
            "SELECT a.id, c.tool_call_id FROM approval_requests a "
            "JOIN awaited_tool_calls c ON c.id = a.awaited_tool_call_id "
            f"WHERE a.workflow_run_id = $1 AND a.status = '{ApprovalStatus.PENDING}'",
            run_id,
        )
    )


async def pending_approval_count(db: Reader, workspace_id: str) -> int:
    return await db.fetchval(  # type: ignore[no-any-return]
        f"SELECT count(*) FROM approval_requests WHERE workspace_id = $1 AND status = '{ApprovalStatus.PENDING}'",
        workspace_id,
    )


async def approval_run_id(db: Reader, workspace_id: str, approval_id: str) -> str | None:
    return await db.fetchval(  # type: ignore[no-any-return]
        "SELECT workflow_run_id FROM approval_requests WHERE id = $1 AND workspace_id = $2",
        approval_id,
        workspace_id,
    )


async def definitions(db: Reader, workspace_id: str) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            "SELECT d.id, d.name, d.version, d.description, d.created_at, "
            "jsonb_array_length(d.steps) AS step_count, "
            "(SELECT count(*) FROM workflow_runs r WHERE r.definition_id = d.id) AS run_count, "
            "(SELECT max(created_at) FROM workflow_runs r WHERE r.definition_id = d.id) AS last_run_at "
            "FROM workflow_definitions d WHERE d.workspace_id = $1 ORDER BY d.name, d.created_at DESC",
            workspace_id,
        )
    )


async def definition(
    db: Reader, workspace_id: str, definition_id: str
) -> tuple[asyncpg.Record, list[asyncpg.Record]] | None:
    """A definition of the workspace and its 10 latest runs."""
    row = await db.fetchrow(
        "SELECT * FROM workflow_definitions WHERE id = $1 AND workspace_id = $2", definition_id, workspace_id
    )
    if row is None:
        return None
    runs = await db.fetch(
        f"SELECT {_RUN_LIST_COLUMNS} FROM {_RUNS_JOIN} "
        "WHERE r.definition_id = $1 AND r.workspace_id = $2 ORDER BY r.created_at DESC LIMIT 10",
        definition_id,
        workspace_id,
    )
    return row, list(runs)


async def ui_user(db: Reader, key_hash: str) -> asyncpg.Record | None:
    """The active API key with this hash and its workspace (a UI login)."""
    return await db.fetchrow(
        "SELECT k.id, k.workspace_id, k.name AS key_name, k.key_prefix, w.name AS workspace_name "
        "FROM api_keys k JOIN workspaces w ON w.id = k.workspace_id "
        "WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
        key_hash,
    )
