"""The provider rate limits' shared buckets (`provider_rate_limits`, one row per configured model;
`stevora.engine.provider_limits` decides what to do with the answers).

Each row holds two token buckets, requests and tokens, refilled continuously at the configured rate
up to the configured capacity, both scaled by `scale` (a provider 429 lowers it). A reservation takes
its cost at once and may drive a bucket negative: the caller is told how long to wait for its turn
(the time until both buckets are back at zero), so concurrent callers queue in the order their
statements ran, with one statement per model call and no lock held while anyone waits.
"""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

# $1 key, $2/$3 capacities (requests, tokens), $4/$5 rates per second, $6 the call's estimated
# tokens, $7 the longest wait the caller accepts (the reservation is not taken beyond it),
# $8 tokens given back by calls answered since this process's last reservation (their estimate
# minus their usage), $9 how much `scale` recovers.
RESERVE_SQL = """
WITH cur AS (
    SELECT b.key, clock_timestamp() AS at, LEAST(1.0, b.scale + $9::float8) AS scale,
           GREATEST(0.0, extract(epoch FROM clock_timestamp() - b.updated_at)) AS dt,
           b.requests, b.tokens + $8::float8 AS tokens
    FROM provider_rate_limits b WHERE b.key = $1
    FOR UPDATE
), refilled AS (
    SELECT key, at, scale,
           LEAST($2::float8 * scale, requests + dt * $4::float8 * scale) AS r,
           LEAST($3::float8 * scale, tokens + dt * $5::float8 * scale) AS t
    FROM cur
), need AS (
    SELECT *, GREATEST(0.0, (1.0 - r) / ($4::float8 * scale), ($6::float8 - t) / ($5::float8 * scale)) AS wait_s
    FROM refilled
)
UPDATE provider_rate_limits b
SET requests = need.r - CASE WHEN need.wait_s <= $7::float8 THEN 1.0 ELSE 0.0 END,
    tokens = need.t - CASE WHEN need.wait_s <= $7::float8 THEN $6::float8 ELSE 0.0 END,
    scale = need.scale,
    updated_at = need.at
FROM need
WHERE b.key = need.key
RETURNING need.wait_s AS wait_s, need.wait_s <= $7::float8 AS granted
"""

CREATE_SQL = """
INSERT INTO provider_rate_limits (key, requests, tokens, scale, updated_at)
VALUES ($1, $2, $3, 1.0, clock_timestamp())
ON CONFLICT (key) DO NOTHING
"""

# A provider 429: $2 the scale factor, $3 the lowest scale, $4 seconds the provider asked to wait
# (0 when it did not say), $5/$6 the requests and tokens it says remain (NULL: not said), $7/$8
# the configured rates per second, $9 the refused call's tokens. The buckets drop to what the
# provider says and below zero by its wait and the refused call (sent again: the SDK or a step
# retry), so nobody else sends before it passes; the refill since the last update is forgone.
REFUSED_SQL = """
UPDATE provider_rate_limits
SET scale = GREATEST($3::float8, scale * $2::float8),
    requests = LEAST(requests, COALESCE($5::float8, requests), -$4::float8 * $7::float8 * scale - 1.0),
    tokens = LEAST(tokens, COALESCE($6::float8, tokens), -$4::float8 * $8::float8 * scale - $9::float8),
    updated_at = clock_timestamp()
WHERE key = $1
"""

SNAPSHOT_SQL = """
SELECT key, requests, tokens, scale,
       GREATEST(0.0, extract(epoch FROM clock_timestamp() - updated_at)) AS age_s
FROM provider_rate_limits WHERE key = ANY($1::text[])
"""


class Reservation(NamedTuple):
    wait_s: float
    granted: bool


class Bucket(NamedTuple):
    key: str
    requests: float  # as last written (not refilled: `age_s` says since when)
    tokens: float
    scale: float
    age_s: float


async def reserve(
    pool: asyncpg.Pool,
    key: str,
    capacity: tuple[float, float],
    per_s: tuple[float, float],
    tokens: float,
    max_wait_s: float,
    given_back: float,
    recover: float,
) -> Reservation | None:
    """Take one request and `tokens` if the wait for them is at most `max_wait_s`; the wait either
    way. None when the bucket does not exist yet (`create` it)."""
    row = await pool.fetchrow(
        RESERVE_SQL,
        key,
        capacity[0],
        capacity[1],
        per_s[0],
        per_s[1],
        tokens,
        max_wait_s,
        given_back,
        recover,
    )
    return None if row is None else Reservation(float(row["wait_s"]), bool(row["granted"]))


async def create(pool: asyncpg.Pool, key: str, capacity: tuple[float, float]) -> None:
    """A full bucket (kept if another process created it first)."""
    await pool.execute(CREATE_SQL, key, capacity[0], capacity[1])


async def refused(
    pool: asyncpg.Pool,
    key: str,
    *,
    factor: float,
    lowest: float,
    retry_after_s: float,
    remaining: tuple[float | None, float | None],
    per_s: tuple[float, float],
    tokens: float,
) -> None:
    await pool.execute(
        REFUSED_SQL,
        key,
        factor,
        lowest,
        retry_after_s,
        remaining[0],
        remaining[1],
        per_s[0],
        per_s[1],
        tokens,
    )


async def snapshot(pool: asyncpg.Pool, keys: list[str]) -> list[Bucket]:
    """The buckets of `keys` as stored (the UI's current use per model)."""
    rows = await pool.fetch(SNAPSHOT_SQL, keys)
    return [Bucket(r["key"], r["requests"], r["tokens"], r["scale"], float(r["age_s"])) for r in rows]


async def deferrals(conn: asyncpg.Connection | asyncpg.Pool, step_run: asyncpg.Record) -> int:
    """How many attempts of this step visit the rate limit did not send (`RATE_LIMITED`)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM step_runs WHERE workflow_run_id = $1 AND step_name = $2 AND visit = $3 "
            "AND error->>'code' = 'RATE_LIMITED'",
            step_run["workflow_run_id"],
            step_run["step_name"],
            step_run["visit"],
        )
    )
