"""Shared setup for the benchmarks: a migrated PostgreSQL database and a workspace.

`STEVORA_DATABASE_URL` picks the server (default: the local one, database `stevora_bench`,
created if missing); when no server answers, an embedded PostgreSQL is started instead.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile

import asyncpg

from stevora.db.database import asyncpg_dsn
from stevora.db.migrate import upgrade_head
from stevora.ids import new_id

DEFAULT_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/stevora_bench"


async def _ensure_database(url: str) -> None:
    base, _, name = url.rpartition("/")
    name = name.split("?")[0]
    conn = await asyncpg.connect(asyncpg_dsn(f"{base}/postgres"))
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


def bench_database_url() -> str:
    url = os.environ.get("STEVORA_DATABASE_URL", DEFAULT_URL)
    try:
        asyncio.run(_ensure_database(url))
    except (OSError, asyncpg.PostgresError):
        from stevora.embedded import start_embedded_postgres

        _, url = start_embedded_postgres(tempfile.mkdtemp(prefix="stevora-bench-"))
    upgrade_head(url)
    return url


async def new_workspace(pool: asyncpg.Pool) -> str:
    ws = new_id("ws")
    await pool.execute(
        "INSERT INTO workspaces (id, name, slug) VALUES ($1, 'bench', $2)", ws, ws.replace("_", "-")
    )
    return ws


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
