"""Shared setup for the benchmarks: a migrated PostgreSQL database and a workspace.

Each benchmark gets a fresh database on the local server (see `bench_database_url`).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import statistics
import tempfile

import asyncpg

from stevora.db.database import asyncpg_dsn
from stevora.db.migrate import upgrade_head
from stevora.ids import new_id

DEFAULT_SERVER = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"


async def _fresh_database(server_url: str, name: str) -> str:
    base, _, rest = server_url.rpartition("/")
    query = rest.partition("?")[2]
    conn = await asyncpg.connect(asyncpg_dsn(server_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"{base}/{name}" + (f"?{query}" if query else "")


def _drop_database(server_url: str, name: str) -> None:
    async def drop() -> None:
        conn = await asyncpg.connect(asyncpg_dsn(server_url))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(drop())


def bench_database_url(name: str) -> str:
    """A fresh, migrated database `stevora_bench_<name>_<pid>` for one benchmark run, dropped at exit.

    Fresh every time: runs left behind by another benchmark (e.g. the API bench creates runs it
    never executes) would otherwise be picked up by a worker's recovery sweep and skew figures.
    `STEVORA_BENCH_SERVER_URL` picks the server (default: the local one); when no server answers,
    an embedded PostgreSQL is started instead.
    """
    server = os.environ.get("STEVORA_BENCH_SERVER_URL", DEFAULT_SERVER)
    # One database per benchmark process: engineers share the server, and a second run of the same
    # benchmark would otherwise drop the first one's database under it (WITH (FORCE)).
    dbname = f"stevora_bench_{name}_{os.getpid()}"
    try:
        url = asyncio.run(_fresh_database(server, dbname))
        atexit.register(_drop_database, server, dbname)
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
