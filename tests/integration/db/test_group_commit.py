"""Group commit on real PostgreSQL: one statement for concurrent runs, each fenced by its own lease,
and a SIGKILL mid-batch never acknowledges a row that is not committed."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from stevora.db.checkpoints import LlmCallRecord, ToolTraceRecord
from stevora.db.group_commit import GroupCommitter
from stevora.errors import LeaseLost
from stevora.settings import Settings
from tests.conftest import Harness, create_definition

OWNER = "group-commit-test"
REPO_ROOT = str(Path(__file__).resolve().parents[3])


async def leased_runs(harness: Harness, workspace_id: str, n: int) -> list[asyncpg.Record]:
    """`n` runs with one committed model call each, put back to RUNNING under OWNER's lease."""
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "gc",
            "version": "1",
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "model": "scripted",
                    "messages": [{"role": "user", "content": "hi"}],
                }
            ],
        },
    )
    from stevora.engine import commands

    ids = [(await commands.create_run(harness.rt, workspace_id, def_id, {}))[0]["id"] for _ in range(n)]
    for run_id in ids:
        await harness.wait_for_status(run_id, "COMPLETED")
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET status = 'RUNNING', lease_owner = $2, lease_expires_at = now() + interval '1 hour' "
        "WHERE id = ANY($1::text[])",
        ids,
        OWNER,
    )
    return await harness.rt.pool.fetch(
        "SELECT DISTINCT ON (c.workflow_run_id) c.workflow_run_id, c.step_run_id, c.id AS llm_call_id "
        "FROM llm_calls c WHERE c.workflow_run_id = ANY($1::text[]) ORDER BY c.workflow_run_id, c.round",
        ids,
    )


def trace(anchor: asyncpg.Record | dict[str, Any], sequence: int) -> ToolTraceRecord:
    return ToolTraceRecord(
        step_run_id=anchor["step_run_id"],
        llm_call_id=anchor["llm_call_id"],
        round=1,
        sequence=sequence,
        tool_call_id=f"call_{sequence}",
        tool_name="noop",
        input_json={"i": sequence},
        output_json={"ok": True},
        status="completed",
        error=None,
        error_code=None,
        result_text=None,
        duration_ms=0.1,
        idempotency_key=f"{anchor['step_run_id']}:1:{sequence}",
    )


async def test_concurrent_checkpoints_share_one_statement_each_fenced_by_its_own_lease(
    harness: Harness, workspace_id: str
) -> None:
    anchors = await leased_runs(harness, workspace_id, 4)
    pool = harness.rt.pool
    lost = anchors[3]["workflow_run_id"]
    await pool.execute("UPDATE workflow_runs SET lease_owner = 'someone-else' WHERE id = $1", lost)
    seq_before = dict(await pool.fetch("SELECT id, event_seq FROM workflow_runs WHERE id = ANY($1::text[])",
                                       [a["workflow_run_id"] for a in anchors]))  # fmt: skip
    gc = GroupCommitter(pool)
    results = await asyncio.gather(
        *(gc.record_tool_trace(a["workflow_run_id"], OWNER, trace(a, 100), "TOOL_CALL_COMPLETED", {"k": 1})
          for a in anchors),
        return_exceptions=True,
    )  # fmt: skip
    assert gc.batches == 1
    for a, result in zip(anchors[:3], results[:3], strict=True):
        assert result == seq_before[a["workflow_run_id"]] + 1
    assert isinstance(results[3], LeaseLost)
    rows = await pool.fetch(
        "SELECT t.workflow_run_id, e.sequence, e.payload FROM tool_trace t JOIN workflow_events e "
        "ON e.workflow_run_id = t.workflow_run_id AND e.event_type = 'TOOL_CALL_COMPLETED' "
        "WHERE t.sequence = 100 AND t.workflow_run_id = ANY($1::text[])",
        [a["workflow_run_id"] for a in anchors],
    )
    assert {r["workflow_run_id"] for r in rows} == {a["workflow_run_id"] for a in anchors[:3]}
    assert all(r["payload"] == {"k": 1} for r in rows)
    assert await pool.fetchval("SELECT event_seq FROM workflow_runs WHERE id = $1", lost) == seq_before[lost]


async def test_concurrent_model_calls_share_one_statement_and_add_each_runs_cost_and_tokens(
    harness: Harness, workspace_id: str
) -> None:
    anchors = await leased_runs(harness, workspace_id, 3)
    pool = harness.rt.pool
    ids = [a["workflow_run_id"] for a in anchors]
    before = {
        r["id"]: r for r in await pool.fetch("SELECT * FROM workflow_runs WHERE id = ANY($1::text[])", ids)
    }
    await pool.execute("UPDATE workflow_runs SET lease_owner = 'someone-else' WHERE id = $1", ids[2])
    gc = GroupCommitter(pool)

    def call(anchor: asyncpg.Record, k: int) -> LlmCallRecord:
        return LlmCallRecord(
            step_run_id=anchor["step_run_id"], step_name="agent", round=50, provider="scripted", model="m",
            status="completed", request={"messages": []}, duration_ms=1.0, response={"text": "hi"},
            input_tokens=10 * k, output_tokens=k, cost_usd=0.001 * k,
        )  # fmt: skip

    results = await asyncio.gather(
        *(gc.record_llm_call(a["workflow_run_id"], OWNER, call(a, k + 1), "LLM_CALL_COMPLETED", {"k": k})
          for k, a in enumerate(anchors)),
        return_exceptions=True,
    )  # fmt: skip
    assert gc.batches == 1
    assert isinstance(results[2], LeaseLost)
    after = {
        r["id"]: r for r in await pool.fetch("SELECT * FROM workflow_runs WHERE id = ANY($1::text[])", ids)
    }
    for k, run_id in enumerate(ids[:2]):
        assert results[k] == before[run_id]["event_seq"] + 1
        assert after[run_id]["total_input_tokens"] == before[run_id]["total_input_tokens"] + 10 * (k + 1)
        assert after[run_id]["total_output_tokens"] == before[run_id]["total_output_tokens"] + k + 1
        assert after[run_id]["total_cost_cents"] == pytest.approx(
            before[run_id]["total_cost_cents"] + 0.1 * (k + 1)
        )
    assert after[ids[2]]["event_seq"] == before[ids[2]]["event_seq"]
    stored = await pool.fetch(
        "SELECT workflow_run_id FROM llm_calls WHERE round = 50 AND workflow_run_id = ANY($1::text[])", ids
    )
    assert {r["workflow_run_id"] for r in stored} == set(ids[:2])


async def test_two_checkpoints_of_one_run_go_in_successive_batches_with_gap_free_sequences(
    harness: Harness, workspace_id: str
) -> None:
    (anchor,) = await leased_runs(harness, workspace_id, 1)
    gc = GroupCommitter(harness.rt.pool)
    run_id = anchor["workflow_run_id"]
    seqs = await asyncio.gather(
        *(
            gc.record_tool_trace(run_id, OWNER, trace(anchor, 200 + i), "TOOL_CALL_COMPLETED", {})
            for i in range(3)
        )
    )
    assert gc.batches == 3
    assert sorted(seqs) == list(range(seqs[0], seqs[0] + 3))
    await gc.drain()
    assert not gc._flushers


async def test_a_duplicate_row_fails_only_its_own_caller(harness: Harness, workspace_id: str) -> None:
    anchors = await leased_runs(harness, workspace_id, 3)
    gc = GroupCommitter(harness.rt.pool)
    await gc.record_tool_trace(
        anchors[0]["workflow_run_id"], OWNER, trace(anchors[0], 300), "TOOL_CALL_COMPLETED", {}
    )
    results = await asyncio.gather(
        *(
            gc.record_tool_trace(a["workflow_run_id"], OWNER, trace(a, 300), "TOOL_CALL_COMPLETED", {})
            for a in anchors
        ),
        return_exceptions=True,
    )
    assert isinstance(results[0], asyncpg.UniqueViolationError)
    assert all(isinstance(r, int) for r in results[1:])
    count = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM tool_trace WHERE sequence = 300 AND workflow_run_id = ANY($1::text[])",
        [a["workflow_run_id"] for a in anchors],
    )
    assert count == 3


_WRITER = textwrap.dedent(
    """
    import asyncio, json, sys
    from stevora.db.database import create_pool
    from stevora.db.group_commit import GroupCommitter
    from tests.integration.db.test_group_commit import trace

    async def main(url, anchors, owner):
        pool = await create_pool(url, max_size=4)
        gc = GroupCommitter(pool)

        async def writer(anchor):
            seq = 1000
            while True:
                seq += 1
                await gc.record_tool_trace(anchor["workflow_run_id"], owner, trace(anchor, seq), "TOOL_CALL_COMPLETED", {})
                print(json.dumps([anchor["llm_call_id"], seq]), flush=True)

        await asyncio.gather(*(writer(a) for a in anchors))

    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]))
    """
)


async def test_sigkill_mid_batch_never_acknowledges_an_uncommitted_row(
    harness: Harness, workspace_id: str, settings: Settings
) -> None:
    """A writer process with 16 concurrent callers is SIGKILLed while batches are in flight: every
    row a caller was told is committed is there, with its event; every trace has its event."""
    anchors = [dict(a) for a in await leased_runs(harness, workspace_id, 16)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _WRITER,
        settings.database_url,
        json.dumps(anchors),
        OWNER,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    acked: set[tuple[str, int]] = set()
    while len(acked) < 400:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line, (await proc.stderr.read()).decode()
        call_id, seq = json.loads(line)
        acked.add((call_id, seq))
    proc.kill()  # SIGKILL, with batches in flight
    for line in (await proc.stdout.read()).decode().splitlines():  # printed before the kill landed
        call_id, seq = json.loads(line)
        acked.add((call_id, seq))
    assert await proc.wait() == -signal.SIGKILL
    ids = [a["workflow_run_id"] for a in anchors]
    traces = await harness.rt.pool.fetch(
        "SELECT llm_call_id, sequence FROM tool_trace WHERE workflow_run_id = ANY($1::text[]) AND sequence > 1000",
        ids,
    )
    committed = {(t["llm_call_id"], t["sequence"]) for t in traces}
    assert acked <= committed  # every acknowledged row is durable
    # ... and the counts agree: one event per trace, and each run's event_seq is its last event.
    check = await harness.rt.pool.fetch(
        "SELECT r.id, r.event_seq, (SELECT max(sequence) FROM workflow_events e WHERE e.workflow_run_id = r.id) AS top, "
        "(SELECT count(*) FROM tool_trace t WHERE t.workflow_run_id = r.id AND t.sequence > 1000) AS traces, "
        "(SELECT count(*) FROM workflow_events e WHERE e.workflow_run_id = r.id AND e.event_type = 'TOOL_CALL_COMPLETED' "
        " AND e.payload = '{}'::jsonb) AS events "
        "FROM workflow_runs r WHERE r.id = ANY($1::text[])",
        ids,
    )
    for row in check:
        assert row["event_seq"] == row["top"]
        assert row["traces"] == row["events"]
