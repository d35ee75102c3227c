"""Per-claim cost of flow control (docs/flow-control.md), against a scratch database.

    .venv/bin/python -m bench.flow_claim [--runs 400]

Claims N PENDING runs one by one (no worker, no broker): with the claim fence before flow control
(RUNNABLE only), with today's fast fence (unkeyed runs: what every run without a key pays), and
keyed runs through `stevora.engine.flow.claim` (the slot path: advisory lock, counted fence).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time

import asyncpg

from stevora.db import runs, transitions
from stevora.db.database import create_pool
from stevora.db.migrate import upgrade_head
from stevora.db.runs import RUNNABLE, FlowColumns
from stevora.engine import flow
from stevora.ids import new_id

SERVER = os.environ.get("STEVORA_BENCH_SERVER", "postgresql://postgres@127.0.0.1:5432")


async def main(n: int) -> None:
    name = f"flow_bench_{secrets.token_hex(3)}"
    admin = await asyncpg.connect(SERVER + "/postgres")
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = SERVER.replace("postgresql://", "postgresql+asyncpg://", 1) + "/" + name
    try:
        await asyncio.to_thread(upgrade_head, url)
        pool = await create_pool(url)
        ws, d = new_id("ws"), new_id("wfdef")
        await pool.execute("INSERT INTO workspaces (id, name, slug) VALUES ($1, 'b', $1)", ws)
        await pool.execute(
            "INSERT INTO workflow_definitions (id, workspace_id, name, version, steps) VALUES ($1, $2, 'b', '1', $3)",
            d,
            ws,
            [{"type": "task", "name": "t", "handler": "x"}],
        )
        old_sql = transitions._claim_sql(RUNNABLE)
        cases = [
            (
                "claim fence before flow control",
                lambda rid: transitions._claim(old_sql, pool, rid, "o", 30),
                None,
            ),
            ("fast fence (a run without a key)", lambda rid: transitions.claim(pool, rid, "o", 30), None),
            (
                "keyed run, slot path",
                lambda rid: flow.claim(pool, rid, "o", 30),
                FlowColumns(concurrency_key="k", concurrency_limit=1_000_000),
            ),
        ]
        for label, claim, columns in cases:
            ids = []
            for _ in range(n):
                row = await runs.insert_run(
                    pool, workspace_id=ws, definition_id=d, input={}, idempotency_key=None, flow=columns
                )
                assert row is not None
                ids.append(row["id"])
            started = time.perf_counter()
            for rid in ids:
                assert await claim(rid) is not None
            print(f"{label}: {(time.perf_counter() - started) / n * 1000:.3f} ms per claim")
        await pool.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    asyncio.run(main(parser.parse_args().runs))
