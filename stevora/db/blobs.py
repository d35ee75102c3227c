"""Images and files of conversations (`blobs`): stored once per workspace by content hash, read
back by hash (docs/providers.md, "Images and files")."""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg

from stevora.attachments import Attachment


async def store(pool: asyncpg.Pool, workspace_id: str, attachments: Iterable[Attachment]) -> None:
    """Each attachment stored once per workspace, whoever stores it first (the same bytes have the
    same hash, so a second writer has nothing to add)."""
    rows = {a.sha256: (workspace_id, a.sha256, a.media_type, len(a.data), a.data) for a in attachments}
    if rows:
        await pool.executemany(
            "INSERT INTO blobs (workspace_id, sha256, media_type, size_bytes, data) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            list(rows.values()),
        )


async def load(pool: asyncpg.Pool, workspace_id: str, hashes: Iterable[str]) -> dict[str, tuple[str, bytes]]:
    """(media type, bytes) by hash, of those this workspace has."""
    wanted = sorted(set(hashes))
    if not wanted:
        return {}
    rows = await pool.fetch(
        "SELECT sha256, media_type, data FROM blobs WHERE workspace_id = $1 AND sha256 = ANY($2::text[])",
        workspace_id,
        wanted,
    )
    return {row["sha256"]: (row["media_type"], bytes(row["data"])) for row in rows}


async def one(pool: asyncpg.Pool, workspace_id: str, sha256: str) -> tuple[str, bytes] | None:
    """(media type, bytes) of one blob of a workspace (the run page's image route), or None."""
    row = await pool.fetchrow(
        "SELECT media_type, data FROM blobs WHERE workspace_id = $1 AND sha256 = $2", workspace_id, sha256
    )
    return None if row is None else (str(row["media_type"]), bytes(row["data"]))
