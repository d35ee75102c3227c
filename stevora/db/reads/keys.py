"""Workspaces and their API keys: the one lookup of a key by its hash (the API's authentication and
the UI's sign-in), the API's key and workspace routes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from stevora.db.reads.rows import Reader, Row, fetch, fetchrow
from stevora.ids import new_id


@dataclass(frozen=True, slots=True)
class KeyOwner(Row):
    """A key found by its hash, with its workspace (revoked keys too: the caller decides)."""

    id: str
    workspace_id: str
    name: str
    key_prefix: str
    revoked_at: datetime | None
    workspace_name: str


async def by_hash(db: Reader, key_hash: str) -> KeyOwner | None:
    return KeyOwner.maybe(
        await fetchrow(
            db,
            "SELECT k.id, k.workspace_id, k.name, k.key_prefix, k.revoked_at, w.name AS workspace_name "
            "FROM api_keys k JOIN workspaces w ON w.id = k.workspace_id WHERE k.key_hash = $1",
            key_hash,
        )
    )


async def touch(db: Reader, key_id: str, gap: timedelta) -> None:
    """`last_used_at = now()` unless it was set within `gap` (few writes under load)."""
    await db.execute(
        "UPDATE api_keys SET last_used_at = now() WHERE id = $1 "
        "AND (last_used_at IS NULL OR last_used_at < now() - $2::interval)",
        key_id,
        gap,
    )


@dataclass(frozen=True, slots=True)
class ApiKeyRow(Row):
    """A key as the API lists it (never its hash)."""

    id: str
    workspace_id: str
    name: str
    key_prefix: str
    last_used_at: datetime | None
    created_at: datetime
    revoked_at: datetime | None


_KEY_COLUMNS = ApiKeyRow.columns()


async def of_workspace(db: Reader, workspace_id: str) -> list[ApiKeyRow]:
    rows = await fetch(
        db,
        f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE workspace_id = $1 ORDER BY created_at, id",
        workspace_id,
    )
    return ApiKeyRow.all(rows)


async def lock_workspace(conn: asyncpg.Connection, workspace_id: str) -> bool:
    """Lock the workspace row (concurrent bootstrap requests take turns); False when it is gone."""
    found = await conn.fetchval("SELECT id FROM workspaces WHERE id = $1 FOR UPDATE", workspace_id)
    return found is not None


async def has_key(conn: asyncpg.Connection, workspace_id: str) -> bool:
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM api_keys WHERE workspace_id = $1)", workspace_id
    )
    return found


async def insert(
    conn: asyncpg.Connection, workspace_id: str, name: str, key_hash: str, key_prefix: str
) -> ApiKeyRow:
    row = await conn.fetchrow(
        "INSERT INTO api_keys (id, workspace_id, name, key_hash, key_prefix) VALUES ($1, $2, $3, $4, $5) "
        f"RETURNING {_KEY_COLUMNS}",
        new_id("key"),
        workspace_id,
        name,
        key_hash,
        key_prefix,
    )
    return ApiKeyRow.of(row)


async def revoke(db: Reader, workspace_id: str, key_id: str) -> ApiKeyRow | None:
    """Sets `revoked_at` once (revoking again keeps the first time)."""
    return ApiKeyRow.maybe(
        await db.fetchrow(
            "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 AND workspace_id = $2 "
            f"RETURNING {_KEY_COLUMNS}",
            key_id,
            workspace_id,
        )
    )


@dataclass(frozen=True, slots=True)
class WorkspaceRow(Row):
    id: str
    name: str
    slug: str
    created_at: datetime
    updated_at: datetime


_WORKSPACE_COLUMNS = WorkspaceRow.columns()


async def workspace(db: Reader, workspace_id: str) -> WorkspaceRow | None:
    return WorkspaceRow.maybe(
        await fetchrow(db, f"SELECT {_WORKSPACE_COLUMNS} FROM workspaces WHERE id = $1", workspace_id)
    )


async def insert_workspace(db: Reader, name: str, slug: str) -> WorkspaceRow | None:
    """The new workspace, or None when the slug is taken."""
    return WorkspaceRow.maybe(
        await db.fetchrow(
            "INSERT INTO workspaces (id, name, slug) VALUES ($1, $2, $3) ON CONFLICT (slug) DO NOTHING "
            f"RETURNING {_WORKSPACE_COLUMNS}",
            new_id("ws"),
            name,
            slug,
        )
    )
