"""Two children of one parent ending at the same moment must not deadlock on the parent's row.

Each child's ending updates its own row twice in one transaction; the second update re-checks the
row's `parent_run_id` foreign key, which key-share-locks the parent. Both endings then lock the
parent to write its tool result. With FOR UPDATE each waited for the other's key-share lock
(PostgreSQL's deadlock detector killed one of them, seen in the chaos suite); `lock_run` takes
FOR NO KEY UPDATE, which a key-share lock does not block.
"""

from __future__ import annotations

import asyncio

from stevora.db import runs
from stevora.engine import commands
from tests.conftest import Harness, create_definition


async def test_sibling_endings_lock_the_parent_one_after_the_other(
    harness: Harness, workspace_id: str
) -> None:
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {"name": "locks", "version": "1", "steps": [{"type": "wait", "name": "w", "durationMs": 60000}]},
    )
    parent, c1, c2 = [
        (await commands.create_run(harness.rt, workspace_id, def_id))[0]["id"] for _ in range(3)
    ]
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET parent_run_id = $1 WHERE id = ANY($2::text[])", parent, [c1, c2]
    )

    pool = harness.rt.pool
    async with pool.acquire() as one, pool.acquire() as two:
        tx1, tx2 = one.transaction(), two.transaction()
        await tx1.start()
        await tx2.start()
        try:
            for conn, child in ((one, c1), (two, c2)):
                for _ in range(2):  # the second update of the row re-checks its parent_run_id
                    await conn.execute("UPDATE workflow_runs SET version = version + 1 WHERE id = $1", child)

            first = await asyncio.wait_for(runs.lock_run(one, parent), timeout=3)
            assert first is not None and first["id"] == parent
            second = asyncio.create_task(runs.lock_run(two, parent))
            await asyncio.sleep(0.3)
            assert not second.done()  # writers of one run are still serialised
            await tx1.commit()
            locked = await asyncio.wait_for(second, timeout=3)
            assert locked is not None and locked["id"] == parent
        finally:
            for tx in (tx1, tx2):
                try:
                    await tx.rollback()
                except Exception:
                    pass
