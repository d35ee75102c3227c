"""What a run has used of its budget, derived from the rows the tool loop already commits.

Nothing is counted twice and nothing separately: the spend is `workflow_runs.total_cost_cents`
(added by each model call's checkpoint), model calls are the run's `llm_calls` rows (completed
and failed), tool calls its `tool_trace` rows except calls of tools a step did not offer
(`TOOL_NOT_OFFERED`, refused without running). A crash, a step retry or a resume therefore
reads exactly what was committed. One statement, read when a step starts or resumes.
"""

from __future__ import annotations

import asyncpg

from stevora.db.runs import ROW_LOCK

# Refused before anything ran: not a tool call the budget pays for.
UNCOUNTED_TOOL_ERROR = "TOOL_NOT_OFFERED"

_USAGE_SQL = f"""
SELECT r.id, r.budget, r.total_cost_cents,
       (SELECT count(*) FROM llm_calls c WHERE c.workflow_run_id = r.id) AS model_calls,
       (SELECT count(*) FROM tool_trace t WHERE t.workflow_run_id = r.id
           AND t.error_code IS DISTINCT FROM '{UNCOUNTED_TOOL_ERROR}') AS tool_calls
  FROM workflow_runs r WHERE r.id = $1
"""


async def usage(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> asyncpg.Record | None:
    """The run's budget and what it has used: `budget, total_cost_cents, model_calls, tool_calls`."""
    return await conn.fetchrow(_USAGE_SQL, run_id)


async def locked_budget(conn: asyncpg.Connection, run_id: str) -> object:
    """The run's budget as committed, its row locked until the transaction ends (the lock a raise
    takes first, so a raise and a step's budget wait are ordered)."""
    return await conn.fetchval(f"SELECT budget FROM workflow_runs WHERE id = $1 {ROW_LOCK}", run_id)
