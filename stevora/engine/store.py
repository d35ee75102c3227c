"""The memory store as tools read it (`ctx.store`): committed documents of the run's workspace.
Writes are the call's checkpoint's (`stevora.db.checkpoints.record_tool_trace_and_store`)."""

from __future__ import annotations

from typing import Any

import asyncpg

from stevora.db import store as db_store
from stevora.tools.store import StoreItem


def item(row: Any) -> StoreItem:
    return StoreItem(
        tuple(row["namespace"].split(".")), row["key"], row["value"], row["updated_at"], row.get("score")
    )


class WorkspaceStore:
    """A `StoreBackend` bound to one workspace."""

    def __init__(self, pool: asyncpg.Pool, workspace_id: str) -> None:
        self.pool = pool
        self.workspace_id = workspace_id

    async def get(self, namespace: str, key: str) -> StoreItem | None:
        row = await db_store.get(self.pool, self.workspace_id, namespace, key)
        return None if row is None else item(row)

    async def search(self, namespace: str, query: str, limit: int) -> list[StoreItem]:
        rows, _ = await db_store.search(self.pool, self.workspace_id, namespace, query or None, limit=limit)
        return [item(r) for r in rows]
