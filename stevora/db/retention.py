"""Retention: delete finished runs, with everything that belongs to them, after a while.

A run's step runs and approval requests reference it with `ON DELETE CASCADE`, and so do its
child runs (`parent_run_id`); its events, LLM calls and tool traces are deleted with it by the
run's delete trigger (migration 0029), so deleting the run row deletes the whole tree. Only
*root* runs are selected: a child goes with its parent, never alone (its parent's history points
at it), and a tree is kept while any run in it is unfinished.

Work is done in batches of `batch_size` root runs, one short transaction each, walking the primary
key with a cursor. Candidate rows are locked `FOR UPDATE SKIP LOCKED`: a row some transaction holds
(a late cancel, a retry command) is skipped, not waited for, and live runs are never touched, so
pruning does not block the engine. A run's age is measured from when it finished
(`completed_at` / `failed_at` / `cancelled_at`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import asyncpg
import structlog

from stevora.statuses import TERMINAL_RUN_STATUSES

log = structlog.get_logger("stevora.retention")

DEFAULT_BATCH_SIZE = 500

PRUNE_SQL = """
WITH RECURSIVE candidates AS (
    SELECT id FROM workflow_runs
    WHERE id > $1 AND parent_run_id IS NULL AND status = ANY($2::text[])
      AND COALESCE(completed_at, failed_at, cancelled_at, updated_at) < now() - $3::interval
    ORDER BY id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), tree AS (
    SELECT id AS root, id FROM candidates
    UNION ALL
    SELECT tree.root, child.id FROM workflow_runs child JOIN tree ON child.parent_run_id = tree.id
), kept AS (
    SELECT DISTINCT tree.root FROM tree JOIN workflow_runs r ON r.id = tree.id
    WHERE r.status <> ALL($5::text[])
), doomed AS (
    SELECT id FROM candidates WHERE id NOT IN (SELECT root FROM kept)
), deleted AS (
    DELETE FROM workflow_runs WHERE id IN (SELECT id FROM doomed) AND NOT $6::bool
    RETURNING id
)
SELECT (SELECT max(id) FROM candidates) AS cursor,
       (SELECT count(*) FROM tree WHERE root IN (SELECT id FROM doomed)) AS runs
"""


async def prune_finished_runs(
    pool: asyncpg.Pool,
    older_than: timedelta,
    statuses: Iterable[str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    dry_run: bool = False,
) -> int:
    """Delete finished runs (and their children) that finished more than `older_than` ago.

    `statuses` limits which root runs are pruned (default: COMPLETED, FAILED, CANCELLED); their
    children go with them whatever their terminal status. Returns how many runs were deleted
    (children included), or with `dry_run` how many would be. Each batch is its own transaction.
    """
    terminal = sorted(str(s) for s in TERMINAL_RUN_STATUSES)
    chosen = sorted({str(s).upper() for s in statuses}) if statuses is not None else terminal
    unknown = set(chosen) - set(terminal)
    if unknown:
        raise ValueError(f"statuses: only finished statuses can be pruned ({', '.join(terminal)})")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    cursor, total = "", 0
    while True:
        row = await pool.fetchrow(PRUNE_SQL, cursor, chosen, older_than, batch_size, terminal, dry_run)
        assert row is not None
        if row["cursor"] is None:
            break
        cursor, total = row["cursor"], total + row["runs"]
        if row["runs"]:
            log.info("runs_pruned", runs=row["runs"], dry_run=dry_run)
    return total
