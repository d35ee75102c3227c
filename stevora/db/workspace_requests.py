"""The API rate limiter's shared token buckets (`rate_limit_buckets`, one row per workspace;
`stevora.throttle.workspace_requests` spends claimed tokens locally)."""

from __future__ import annotations

import asyncpg

# One statement: refill the bucket for the time since its last update, take up to $4 whole tokens.
CLAIM_SQL = """
WITH current AS (
    SELECT LEAST($2::float8, tokens + GREATEST(0, extract(epoch FROM now() - updated_at)) * $3::float8) AS avail
    FROM rate_limit_buckets WHERE workspace_id = $1
    FOR UPDATE
)
UPDATE rate_limit_buckets b
SET tokens = current.avail - LEAST($4::float8, floor(current.avail)), updated_at = now()
FROM current
WHERE b.workspace_id = $1
RETURNING LEAST($4::float8, floor(current.avail))::int AS granted, b.tokens AS remaining
"""
CREATE_SQL = """
INSERT INTO rate_limit_buckets (workspace_id, tokens, updated_at) VALUES ($1, $2, now())
ON CONFLICT (workspace_id) DO NOTHING
"""


async def claim(
    pool: asyncpg.Pool, workspace_id: str, capacity: float, rate_per_s: float, batch: int
) -> asyncpg.Record | None:
    """Refill the bucket and take up to `batch` whole tokens: (granted, remaining), or None when
    the workspace has no bucket yet."""
    return await pool.fetchrow(CLAIM_SQL, workspace_id, capacity, rate_per_s, batch)


async def create(pool: asyncpg.Pool, workspace_id: str, capacity: float) -> None:
    """A full bucket (kept if another process created it first); ForeignKeyViolationError for a
    workspace that does not exist."""
    await pool.execute(CREATE_SQL, workspace_id, capacity)
