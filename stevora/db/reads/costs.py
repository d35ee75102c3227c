"""What the model calls cost: one run's calls, and a workspace's totals per model over a window
(the API's cost routes). A fork's inherited calls are its origin's (counted once, there); replays
are left out of a workspace's totals unless asked for (docs/time-travel.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stevora.db.reads.rows import Reader, Row, fetch, fetchval


@dataclass(frozen=True, slots=True)
class CallCost(Row):
    step_name: str
    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    created_at: datetime
    status: str


async def of_run(db: Reader, run_id: str) -> list[CallCost]:
    """The run's model calls, oldest first."""
    rows = await fetch(
        db,
        f"SELECT {CallCost.columns()} FROM llm_calls WHERE workflow_run_id = $1 ORDER BY created_at, round, id",
        run_id,
    )
    return CallCost.all(rows)


@dataclass(frozen=True, slots=True)
class ModelCost(Row):
    model: str
    provider: str | None
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float


def _where(
    workspace_id: str, start: datetime | None, end: datetime | None, include_replays: bool
) -> tuple[str, list[Any]]:
    """(the conditions on calls `c` of runs `r` created in [start, end), their arguments)."""
    args: list[Any] = [workspace_id]
    conditions = ["r.workspace_id = $1", "c.inherited_from IS NULL"]
    if not include_replays:
        conditions.append("r.replay_of IS NULL")
    if start is not None:
        args.append(start)
        conditions.append(f"c.created_at >= ${len(args)}")
    if end is not None:
        args.append(end)
        conditions.append(f"c.created_at < ${len(args)}")
    return " AND ".join(conditions), args


_CALLS_OF_RUNS = "FROM llm_calls c JOIN workflow_runs r ON r.id = c.workflow_run_id WHERE"


async def by_model(
    db: Reader, workspace_id: str, start: datetime | None, end: datetime | None, include_replays: bool = False
) -> list[ModelCost]:
    """The calls summed per (model, provider), the costliest first."""
    where, args = _where(workspace_id, start, end, include_replays)
    rows = await fetch(
        db,
        "SELECT c.model, c.provider, count(*) AS calls, coalesce(sum(c.input_tokens), 0) AS input_tokens, "
        "coalesce(sum(c.output_tokens), 0) AS output_tokens, coalesce(sum(c.cost_usd), 0.0) AS cost_usd "
        f"{_CALLS_OF_RUNS} {where} GROUP BY c.model, c.provider ORDER BY sum(c.cost_usd) DESC, c.model",
        *args,
    )
    return ModelCost.all(rows)


async def run_count(
    db: Reader, workspace_id: str, start: datetime | None, end: datetime | None, include_replays: bool = False
) -> int:
    """How many runs those calls belong to."""
    where, args = _where(workspace_id, start, end, include_replays)
    total: int = await fetchval(
        db, f"SELECT count(DISTINCT c.workflow_run_id) {_CALLS_OF_RUNS} {where}", *args
    )
    return total
