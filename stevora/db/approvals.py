"""Guarded statements on approval requests (callers own the transaction)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from stevora.ids import new_id


async def insert(
    conn: asyncpg.Connection,
    *,
    workspace_id: str,
    run_id: str,
    step_run_id: str,
    step_name: str,
    content_key: str,
    content: Any,
    prompt: str | None,
    expires_at: datetime | None,
    awaited_tool_call_id: str | None = None,
) -> str:
    approval_id = new_id("apr")
    await conn.execute(
        "INSERT INTO approval_requests (id, workspace_id, workflow_run_id, step_run_id, step_name, "
        "content_key, content, prompt, expires_at, awaited_tool_call_id) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        approval_id,
        workspace_id,
        run_id,
        step_run_id,
        step_name,
        content_key,
        content,
        prompt,
        expires_at,
        awaited_tool_call_id,
    )
    return approval_id


async def expire_for_step(conn: asyncpg.Connection, step_run_id: str) -> None:
    await conn.execute(
        "UPDATE approval_requests SET status = 'EXPIRED', updated_at = now() "
        "WHERE step_run_id = $1 AND status = 'PENDING'",
        step_run_id,
    )


async def cancel_for_run(conn: asyncpg.Connection, run_id: str) -> None:
    await conn.execute(
        "UPDATE approval_requests SET status = 'CANCELLED', updated_at = now() "
        "WHERE workflow_run_id = $1 AND status = 'PENDING'",
        run_id,
    )


async def decide(
    conn: asyncpg.Connection,
    workspace_id: str,
    approval_id: str,
    decision: str,
    edited_content: Any,
    decided_by: str | None,
) -> asyncpg.Record | None:
    """PENDING → DECIDED; None when the request is missing or no longer pending."""
    return await conn.fetchrow(
        "UPDATE approval_requests SET status = 'DECIDED', decision = $3, edited_content = $4, decided_by = $5, "
        "decided_at = now(), updated_at = now() WHERE id = $1 AND workspace_id = $2 AND status = 'PENDING' "
        "RETURNING *",
        approval_id,
        workspace_id,
        decision,
        edited_content,
        decided_by,
    )


async def status_of(conn: asyncpg.Connection, workspace_id: str, approval_id: str) -> str | None:
    value = await conn.fetchval(
        "SELECT status FROM approval_requests WHERE id = $1 AND workspace_id = $2", approval_id, workspace_id
    )
    return str(value) if value is not None else None
