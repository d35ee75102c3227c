"""MCP statements (docs/mcp.md): pinned tool lists, binary results, the servers workers publish
and the servers workspaces register."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import asyncpg

from stevora.ids import new_id

# A fork or replay offers the list its origin pinned: the lookup walks up the chain of origins
# (bounded: a chain is as deep as forks of forks go).
_PINS_ALONG_ORIGINS = """
WITH RECURSIVE chain(id, depth) AS (
    SELECT $1::text, 0
    UNION ALL
    SELECT COALESCE(r.forked_from_run_id, r.replay_of), c.depth + 1
    FROM workflow_runs r JOIN chain c ON r.id = c.id
    WHERE COALESCE(r.forked_from_run_id, r.replay_of) IS NOT NULL AND c.depth < 50
)
SELECT DISTINCT ON (p.server) p.workflow_run_id, p.server, p.tools, p.server_name, p.server_version
FROM chain c JOIN mcp_tool_pins p ON p.workflow_run_id = c.id AND p.step_name = $2
ORDER BY p.server, c.depth
"""


async def pinned(pool: asyncpg.Pool, run_id: str, step_name: str) -> dict[str, asyncpg.Record]:
    """The step's pinned lists by server: its own, else the nearest origin's."""
    return {row["server"]: row for row in await pool.fetch(_PINS_ALONG_ORIGINS, run_id, step_name)}


async def pin(
    pool: asyncpg.Pool,
    run_id: str,
    step_name: str,
    server: str,
    tools: list[dict[str, Any]],
    server_name: str | None,
    server_version: str | None,
) -> list[dict[str, Any]]:
    """Pin `tools` unless a list is pinned already (two executions racing: the first wins);
    returns the list that is pinned."""
    row = await pool.fetchrow(
        "WITH ins AS (INSERT INTO mcp_tool_pins (workflow_run_id, step_name, server, tools, server_name, "
        "server_version) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING tools) "
        "SELECT tools FROM ins UNION ALL SELECT tools FROM mcp_tool_pins "
        "WHERE workflow_run_id = $1 AND step_name = $2 AND server = $3 LIMIT 1",
        run_id,
        step_name,
        server,
        tools,
        server_name,
        server_version,
    )
    return list(row["tools"]) if row is not None else tools


async def pins_of_run(pool: asyncpg.Pool, run_id: str) -> list[asyncpg.Record]:
    """Every list a run's steps pinned (the API's trace view and the run page)."""
    return list(
        await pool.fetch(
            "SELECT step_name, server, tools, server_name, server_version FROM mcp_tool_pins "
            "WHERE workflow_run_id = $1",
            run_id,
        )
    )


async def store_blobs(pool: asyncpg.Pool, blobs: Iterable[tuple[str, str, bytes]]) -> None:
    """(sha256, mime type, bytes): each stored once, whoever stores it first."""
    rows = list(blobs)
    if rows:
        await pool.executemany(
            "INSERT INTO mcp_blobs (sha256, mime_type, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            rows,
        )


async def blob(pool: asyncpg.Pool, sha256: str) -> asyncpg.Record | None:
    return await pool.fetchrow("SELECT mime_type, data FROM mcp_blobs WHERE sha256 = $1", sha256)


async def publish_worker_servers(
    pool: asyncpg.Pool, worker_id: str, servers: list[tuple[str, str, str, int, str | None, str | None]]
) -> None:
    """(name, transport, state, restarts, last error, server version) of this worker's servers."""
    if servers:
        await pool.executemany(
            "INSERT INTO mcp_worker_servers (worker_id, name, transport, state, restarts, last_error, "
            "server_version) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (worker_id, name) DO UPDATE "
            "SET transport = EXCLUDED.transport, state = EXCLUDED.state, restarts = EXCLUDED.restarts, "
            "last_error = EXCLUDED.last_error, "
            "server_version = COALESCE(EXCLUDED.server_version, mcp_worker_servers.server_version), "
            "updated_at = now()",
            [(worker_id, *server) for server in servers],
        )


async def forget_worker(pool: asyncpg.Pool, worker_id: str) -> None:
    """A worker that shuts down cleanly takes its servers off the list."""
    await pool.execute("DELETE FROM mcp_worker_servers WHERE worker_id = $1", worker_id)


async def worker_servers(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return list(
        await pool.fetch(
            "SELECT worker_id, name, transport, state, restarts, last_error, server_version, updated_at "
            "FROM mcp_worker_servers ORDER BY name, worker_id"
        )
    )


async def known_server_names(pool: asyncpg.Pool, workspace_id: str) -> set[str]:
    """The servers a definition of this workspace may name: any worker's, and its own."""
    rows = await pool.fetch(
        "SELECT name FROM mcp_worker_servers UNION SELECT name FROM mcp_servers WHERE workspace_id = $1",
        workspace_id,
    )
    return {row["name"] for row in rows}


async def registered(pool: asyncpg.Pool, workspace_id: str, name: str) -> asyncpg.Record | None:
    """A workspace's registered server (with its headers: for the worker's client only)."""
    return await pool.fetchrow(
        "SELECT id, name, url, headers, timeout_ms FROM mcp_servers WHERE workspace_id = $1 AND name = $2",
        workspace_id,
        name,
    )


async def register(
    pool: asyncpg.Pool, workspace_id: str, name: str, url: str, headers: dict[str, str], timeout_ms: int
) -> asyncpg.Record | None:
    """The new registration, or None when the workspace has a server of that name already."""
    return await pool.fetchrow(
        "INSERT INTO mcp_servers (id, workspace_id, name, url, headers, timeout_ms) "
        "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (workspace_id, name) DO NOTHING "
        "RETURNING id, name, url, headers, timeout_ms, created_at",
        new_id("mcps"),
        workspace_id,
        name,
        url,
        headers,
        timeout_ms,
    )


async def registrations(pool: asyncpg.Pool, workspace_id: str) -> list[asyncpg.Record]:
    return list(
        await pool.fetch(
            "SELECT id, name, url, headers, timeout_ms, created_at FROM mcp_servers WHERE workspace_id = $1 "
            "ORDER BY name",
            workspace_id,
        )
    )


async def unregister(pool: asyncpg.Pool, workspace_id: str, server_id: str) -> bool:
    status = await pool.execute(
        "DELETE FROM mcp_servers WHERE workspace_id = $1 AND id = $2", workspace_id, server_id
    )
    return str(status).endswith(" 1")
