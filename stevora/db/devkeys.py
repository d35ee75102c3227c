"""`stevora dev`'s API key for the `default` workspace (stevora.devstack)."""

from __future__ import annotations

import hashlib

import asyncpg

from stevora.ids import new_id, random_token


async def dev_key(conn: asyncpg.Connection, existing: str | None) -> tuple[str, bool]:
    """`existing` if it is still an active key, else a new key for the `default` workspace
    (created if missing); True when the key is new."""
    if existing:
        digest = hashlib.sha256(existing.encode()).hexdigest()
        if await conn.fetchval("SELECT 1 FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", digest):
            return existing, False
    ws = await conn.fetchval("SELECT id FROM workspaces WHERE slug = 'default'")
    if ws is None:
        ws = new_id("ws")
        await conn.execute("INSERT INTO workspaces (id, name, slug) VALUES ($1, 'Default', 'default')", ws)
    raw = f"stv_{random_token(32)}"
    await conn.execute(
        "INSERT INTO api_keys (id, workspace_id, name, key_hash, key_prefix) VALUES ($1, $2, 'dev', $3, $4)",
        new_id("key"), ws, hashlib.sha256(raw.encode()).hexdigest(), raw[:8],
    )  # fmt: skip
    return raw, True
