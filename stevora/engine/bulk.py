"""Runs in bulk (docs/time-travel.md): retrying every FAILED run of a definition or a list, and the
comparison of replays with the runs they replay.

A bulk retry is the single-run retry (`commands.retry_run`) once per run, each in its own
transaction: one run's failure to retry (it moved meanwhile, its concurrency slot is taken) is
reported for that run and does not stop the others.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from stevora.db import forks as db_forks
from stevora.engine import commands
from stevora.engine.steps.llm_recorded import replay_report
from stevora.errors import StevoraError
from stevora.statuses import RunStatus

if TYPE_CHECKING:
    from stevora.runtime import Runtime

MAX_RUNS = 1000  # runs one bulk call takes (a bulk retry, a bulk replay, a comparison)
ENDED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


async def failed_runs(
    rt: Runtime,
    workspace_id: str,
    *,
    definition_name: str | None,
    since: datetime | None,
    until: datetime | None,
    run_ids: list[str] | None,
) -> tuple[list[str], bool]:
    """The FAILED runs a bulk retry takes, oldest failure first, and whether there were more than
    `MAX_RUNS` (the rest are left for another call)."""
    ids = await db_forks.failed_runs(
        rt.pool,
        workspace_id,
        definition_name=definition_name,
        since=since,
        until=until,
        run_ids=run_ids,
        limit=MAX_RUNS + 1,
    )
    return ids[:MAX_RUNS], len(ids) > MAX_RUNS


async def retry_each(rt: Runtime, workspace_id: str, run_ids: list[str]) -> list[dict[str, Any]]:
    """Retry each run in turn; per run `{runId, outcome: "RETRIED", status}` or `{runId, outcome:
    "ERROR", error: {code, message}}`."""
    results: list[dict[str, Any]] = []
    for run_id in run_ids:
        try:
            row = await commands.retry_run(rt, workspace_id, run_id)
        except StevoraError as exc:
            results.append(
                {"runId": run_id, "outcome": "ERROR", "error": {"code": exc.code, "message": exc.message}}
            )
            continue
        results.append({"runId": run_id, "outcome": "RETRIED", "status": row["status"]})
    return results


def _side(row: Any, tool_calls: dict[str, int] | None = None) -> dict[str, Any]:
    side = {
        "runId": row["id"],
        "status": row["status"],
        "output": row["output"],
        "error": row["error"],
        "rounds": row["rounds"],
        "toolCalls": tool_calls if tool_calls is not None else {"total": row["tool_calls"]},
        "inputTokens": row["total_input_tokens"],
        "outputTokens": row["total_output_tokens"],
        "costUsd": round(row["total_cost_cents"] / 100, 10),
        "latencyMs": None if row["latency_ms"] is None else round(row["latency_ms"], 1),
    }
    return side


async def compare(rt: Runtime, workspace_id: str, replay_ids: list[str]) -> dict[str, Any]:
    """Each replay beside the run it replays: status, final output, rounds (completed model calls),
    tool calls (the replay's matched / unmatched / live), tokens, cost and latency. `done` once
    every replay has ended. Ids that are not replays of this workspace are listed in `unknown`."""
    async with rt.pool.acquire() as conn:
        replays = await db_forks.run_summaries(conn, workspace_id, replay_ids)
        origin_ids = sorted({r["replay_of"] for r in replays.values() if r["replay_of"]})
        origins = await db_forks.run_summaries(conn, workspace_id, origin_ids)
    rows: list[dict[str, Any]] = []
    unknown: list[str] = []
    for replay_id in replay_ids:
        replay = replays.get(replay_id)
        if replay is None or replay["replay_of"] is None:
            unknown.append(replay_id)
            continue
        origin = origins.get(replay["replay_of"])
        counts = await replay_report(rt.pool, replay_id)
        rows.append(
            {
                "runId": replay["replay_of"],
                "replayId": replay_id,
                "origin": None if origin is None else _side(origin),  # None: the origin was pruned
                "replay": _side(replay, counts),
                "sameOutput": origin is not None and origin["output"] == replay["output"],
                "sameStatus": origin is not None and origin["status"] == replay["status"],
            }
        )
    done = all(r["replay"]["status"] in ENDED for r in rows)
    return {"done": done, "runs": rows, "unknown": unknown}
