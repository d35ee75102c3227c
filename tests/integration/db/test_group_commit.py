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

from stevora.db import checkpoint_sql, checkpoints, group_commit
from stevora.db.checkpoints import LlmCallRecord, ToolTraceRecord
from stevora.db.database import create_pool, dumps
from stevora.db.group_commit import GroupCommitter
from stevora.errors import LeaseLost
from stevora.settings import Settings
from tests.conftest import Harness, create_definition
from tests.integration.engine.test_db_outage import CommitThenDrop, kill_the_next_writer

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


async def leased(
    harness: Harness, workspace_id: str, n: int
) -> tuple[list[asyncpg.Record], asyncpg.Pool, list[str]]:
    anchors = await leased_runs(harness, workspace_id, n)
    return anchors, harness.rt.pool, [a["workflow_run_id"] for a in anchors]


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


def committer(pool: Any, **kw: Any) -> GroupCommitter:
    return GroupCommitter(pool, **kw)


async def record_trace(
    gc: GroupCommitter, anchor: Any, sequence: int, payload: dict[str, Any] | None = None, **kw: Any
) -> None:
    await checkpoints.record_tool_trace(
        gc,
        anchor["workflow_run_id"],
        OWNER,
        trace(anchor, sequence),
        "TOOL_CALL_COMPLETED",
        payload or {},
        **kw,
    )


async def event_seqs(pool: asyncpg.Pool, ids: list[str]) -> dict[str, int]:
    return dict(await pool.fetch("SELECT id, event_seq FROM workflow_runs WHERE id = ANY($1::text[])", ids))


async def traces_of(pool: asyncpg.Pool, ids: list[str], sequence: int) -> list[asyncpg.Record]:
    """Each trace row at `sequence` with its event (a trace without its event has event_seq NULL)."""
    return await pool.fetch(
        "SELECT t.workflow_run_id, t.child_run_id, e.sequence AS event_seq, e.payload FROM tool_trace t "
        "LEFT JOIN workflow_events e ON e.workflow_run_id = t.workflow_run_id "
        "AND e.payload->>'traceSeq' = t.sequence::text "
        "WHERE t.sequence = $2 AND t.workflow_run_id = ANY($1::text[])",
        ids,
        sequence,
    )


async def test_concurrent_checkpoints_share_one_statement_each_fenced_by_its_own_lease(
    harness: Harness, workspace_id: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 4)
    lost = ids[3]
    await pool.execute("UPDATE workflow_runs SET lease_owner = 'someone-else' WHERE id = $1", lost)
    seq_before = await event_seqs(pool, ids)
    gc = committer(pool)
    results = await asyncio.gather(
        *(record_trace(gc, a, 100, {"traceSeq": 100}) for a in anchors), return_exceptions=True
    )
    assert gc.batches == 1 and gc.rows == 3
    assert results[:3] == [None, None, None]
    assert isinstance(results[3], LeaseLost)  # only the caller whose lease is gone
    rows = await traces_of(pool, ids, 100)
    assert {r["workflow_run_id"] for r in rows} == set(ids[:3])
    for r in rows:
        assert r["event_seq"] == seq_before[r["workflow_run_id"]] + 1 and r["payload"] == {"traceSeq": 100}
    assert (await event_seqs(pool, [lost]))[lost] == seq_before[lost]


async def test_concurrent_model_calls_share_one_statement_add_each_runs_cost_and_return_its_commit_time(
    harness: Harness, workspace_id: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 3)
    before = {
        r["id"]: r for r in await pool.fetch("SELECT * FROM workflow_runs WHERE id = ANY($1::text[])", ids)
    }
    await pool.execute("UPDATE workflow_runs SET lease_owner = 'someone-else' WHERE id = $1", ids[2])
    gc = committer(pool)
    recs = [
        LlmCallRecord(
            step_run_id=a["step_run_id"], step_name="agent", round=50, provider="scripted", model="m",
            status="completed", request={"messages": []}, duration_ms=1.0, response={"text": "hi"},
            finish_reason="stop", input_tokens=10 * (k + 1), output_tokens=k + 1, cache_read_tokens=3,
            cache_write_tokens=4, cost_usd=0.001 * (k + 1),
        )
        for k, a in enumerate(anchors)
    ]  # fmt: skip
    results = await asyncio.gather(
        *(
            checkpoints.record_llm_call(gc, a["workflow_run_id"], OWNER, rec, "LLM_CALL_COMPLETED", {"k": k})
            for k, (a, rec) in enumerate(zip(anchors, recs, strict=True))
        ),
        return_exceptions=True,
    )
    assert gc.batches == 1
    assert isinstance(results[2], LeaseLost)
    after = {
        r["id"]: r for r in await pool.fetch("SELECT * FROM workflow_runs WHERE id = ANY($1::text[])", ids)
    }
    for k, run_id in enumerate(ids[:2]):
        assert after[run_id]["event_seq"] == before[run_id]["event_seq"] + 1
        assert after[run_id]["total_input_tokens"] == before[run_id]["total_input_tokens"] + 10 * (k + 1)
        assert after[run_id]["total_output_tokens"] == before[run_id]["total_output_tokens"] + k + 1
        assert after[run_id]["total_cost_cents"] == pytest.approx(
            before[run_id]["total_cost_cents"] + 0.1 * (k + 1)
        )
        row = await pool.fetchrow("SELECT * FROM llm_calls WHERE id = $1", recs[k].id)
        assert results[k] == row["created_at"]  # the tool-output timeout counts from it
        assert (row["finish_reason"], row["cache_read_tokens"], row["cache_write_tokens"]) == ("stop", 3, 4)
        assert (row["request"], row["response"], row["step_name"], row["workflow_run_id"]) == (
            {"messages": []},
            {"text": "hi"},
            "agent",
            run_id,
        )
    assert after[ids[2]]["event_seq"] == before[ids[2]]["event_seq"]
    assert await pool.fetchval("SELECT count(*) FROM llm_calls WHERE id = $1", recs[2].id) == 0


async def test_tool_state_updates_merge_into_each_runs_state_in_the_batch(
    harness: Harness, workspace_id: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 3)
    await pool.execute(
        'UPDATE workflow_runs SET state = \'{"keep": 1, "n": 0}\' WHERE id = ANY($1::text[])', ids
    )
    gc = committer(pool)
    await asyncio.gather(
        record_trace(gc, anchors[0], 400, state_updates={"n": 1, "seen": ["a"]}),
        record_trace(gc, anchors[1], 400, state_updates={"n": 2}),
        record_trace(gc, anchors[2], 400),  # no updates: state untouched
    )
    assert gc.batches == 1
    states = dict(await pool.fetch("SELECT id, state FROM workflow_runs WHERE id = ANY($1::text[])", ids))
    assert states[ids[0]] == {"keep": 1, "n": 1, "seen": ["a"]}
    assert states[ids[1]] == {"keep": 1, "n": 2}
    assert states[ids[2]] == {"keep": 1, "n": 0}


async def test_child_run_id_is_written(harness: Harness, workspace_id: str) -> None:
    anchors = await leased_runs(harness, workspace_id, 2)
    gc = committer(harness.rt.pool)
    recs = [trace(a, 450) for a in anchors]
    recs[0].child_run_id = "run_child"
    await asyncio.gather(
        *(
            checkpoints.record_tool_trace(gc, a["workflow_run_id"], OWNER, rec, "TOOL_CALL_COMPLETED", {})
            for a, rec in zip(anchors, recs, strict=True)
        )
    )
    stored = dict(
        await harness.rt.pool.fetch(
            "SELECT id, child_run_id FROM tool_trace WHERE sequence = 450 AND workflow_run_id = ANY($1::text[])",
            [a["workflow_run_id"] for a in anchors],
        )
    )
    assert stored == {recs[0].id: "run_child", recs[1].id: None}


async def test_two_checkpoints_of_one_run_go_in_successive_batches_with_gap_free_sequences(
    harness: Harness, workspace_id: str
) -> None:
    (anchor,) = await leased_runs(harness, workspace_id, 1)
    gc = committer(harness.rt.pool)
    run_id = anchor["workflow_run_id"]
    before = (await event_seqs(harness.rt.pool, [run_id]))[run_id]
    await asyncio.gather(*(record_trace(gc, anchor, 200 + i) for i in range(3)))
    assert gc.batches == 3
    events = await harness.rt.pool.fetch(
        "SELECT sequence FROM workflow_events WHERE workflow_run_id = $1 AND sequence > $2 ORDER BY sequence",
        run_id,
        before,
    )
    assert [e["sequence"] for e in events] == [before + 1, before + 2, before + 3]
    await gc.drain()
    assert gc._flusher is None


async def test_callers_a_statement_woke_join_the_next_one_with_the_rows_queued_meanwhile(
    harness: Harness, workspace_id: str
) -> None:
    anchors = await leased_runs(harness, workspace_id, 6)
    gc = committer(harness.rt.pool)

    async def twice(anchor: Any) -> None:
        await record_trace(gc, anchor, 600)
        await record_trace(gc, anchor, 601)  # the next checkpoint, as soon as the first is durable

    first = [asyncio.create_task(twice(a)) for a in anchors[:3]]
    for _ in range(10_000):  # until the flusher has taken the first three for its statement
        if gc._in_flight and not gc._queued:
            break
        await asyncio.sleep(0)
    queued = [asyncio.create_task(record_trace(gc, a, 600)) for a in anchors[3:]]
    await asyncio.gather(*first, *queued)
    # Statement 1: the first three. Statement 2: the three queued while it was in flight and the
    # first three's next checkpoints, written during the loop turn the flusher waits first
    # (without that turn they went in a third statement of their own).
    assert (gc.batches, gc.rows) == (2, 9)
    ids = [a["workflow_run_id"] for a in anchors]
    assert len(await traces_of(harness.rt.pool, ids, 600)) == 6
    assert len(await traces_of(harness.rt.pool, ids[:3], 601)) == 3


async def test_a_duplicate_row_fails_only_its_own_caller(harness: Harness, workspace_id: str) -> None:
    anchors = await leased_runs(harness, workspace_id, 3)
    gc = committer(harness.rt.pool)
    await record_trace(gc, anchors[0], 300)
    results = await asyncio.gather(*(record_trace(gc, a, 300) for a in anchors), return_exceptions=True)
    assert isinstance(results[0], asyncpg.UniqueViolationError)
    assert results[1:] == [None, None]
    count = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM tool_trace WHERE sequence = 300 AND workflow_run_id = ANY($1::text[])",
        [a["workflow_run_id"] for a in anchors],
    )
    assert count == 3


async def test_a_lone_caller_sends_one_single_row_statement_per_checkpoint(
    harness: Harness, workspace_id: str
) -> None:
    (anchor,) = await leased_runs(harness, workspace_id, 1)
    pool = CountingPool(harness.rt.pool)
    gc = committer(pool)
    for i in range(5):
        await record_trace(gc, anchor, 500 + i)
    assert gc.batches == 5 and gc.rows == 5
    assert pool.statements == [checkpoint_sql.TOOL_TRACE.single_sql] * 5


async def test_with_group_commit_off_each_caller_sends_its_own_statement(
    harness: Harness, workspace_id: str
) -> None:
    anchors = await leased_runs(harness, workspace_id, 4)
    pool = CountingPool(harness.rt.pool)
    gc = committer(pool, enabled=False)
    await asyncio.gather(*(record_trace(gc, a, 550) for a in anchors))
    assert gc.batches == 4
    assert pool.statements == [checkpoint_sql.TOOL_TRACE.single_sql] * 4


async def test_a_batch_whose_connection_is_killed_in_flight_is_retried_and_nothing_doubles(
    harness: Harness, workspace_id: str, database_url: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 4)
    seq_before = await event_seqs(pool, ids)
    gc = committer(pool)
    # The batch blocks on one run's row lock, and its backend is terminated while it waits.
    killer = await kill_the_next_writer(database_url, ids[0])
    results = await asyncio.gather(
        *(record_trace(gc, a, 600, {"traceSeq": 600}) for a in anchors), return_exceptions=True
    )
    assert await killer == 1
    assert results == [None] * 4
    assert gc.batches == 1  # the killed try did not commit; the retry was one batch again
    rows = await traces_of(pool, ids, 600)
    assert sorted(r["workflow_run_id"] for r in rows) == sorted(ids)
    for r in rows:
        assert r["event_seq"] == seq_before[r["workflow_run_id"]] + 1
    assert await event_seqs(pool, ids) == {i: seq_before[i] + 1 for i in ids}


async def test_a_batch_that_committed_but_lost_its_connection_is_found_recorded_row_by_row(
    harness: Harness, workspace_id: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 3)
    seq_before = await event_seqs(pool, ids)
    tokens_sql = "SELECT id, total_input_tokens FROM workflow_runs WHERE id = ANY($1::text[])"
    tokens_before = dict(await pool.fetch(tokens_sql, ids))
    dropping = CommitThenDrop(pool)
    gc = committer(dropping)
    recs = [
        LlmCallRecord(step_run_id=a["step_run_id"], step_name="agent", round=60, provider="scripted", model="m",
                      status="completed", request={}, duration_ms=1.0, input_tokens=5)
        for a in anchors
    ]  # fmt: skip
    results = await asyncio.gather(
        *(
            checkpoints.record_llm_call(gc, a["workflow_run_id"], OWNER, rec, "LLM_CALL_COMPLETED", {})
            for a, rec in zip(anchors, recs, strict=True)
        )
    )
    # try 1 (committed, reported lost), the retried batch (unique violation), then each row alone
    assert dropping.calls == 2 + 3
    stored = {r["id"]: r["created_at"] for r in await pool.fetch("SELECT id, created_at FROM llm_calls WHERE round = 60 "
                                                                 "AND workflow_run_id = ANY($1::text[])", ids)}  # fmt: skip
    assert results == [stored[rec.id] for rec in recs]  # each caller gets its row's commit time
    assert await event_seqs(pool, ids) == {i: seq_before[i] + 1 for i in ids}
    # written once: the retries added nothing
    assert dict(await pool.fetch(tokens_sql, ids)) == {i: tokens_before[i] + 5 for i in ids}


class CountingPool:
    """The pool, recording each checkpoint statement sent."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.statements: list[str] = []

    async def fetch(self, sql: str, *args: Any) -> Any:
        self.statements.append(sql)
        return await self.pool.fetch(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self.pool.fetchval(sql, *args)


_WRITER = textwrap.dedent(
    """
    import asyncio, json, sys
    from stevora.db.database import create_pool
    from stevora.db import checkpoints
    from stevora.db.group_commit import GroupCommitter
    from tests.integration.db.test_group_commit import trace

    async def main(url, anchors, owner):
        pool = await create_pool(url, max_size=4)
        gc = GroupCommitter(pool)

        async def writer(anchor):
            seq = 1000
            while True:
                seq += 1
                await checkpoints.record_tool_trace(
                    gc, anchor["workflow_run_id"], owner, trace(anchor, seq), "TOOL_CALL_COMPLETED", {}
                )
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


async def test_concurrent_tool_loops_share_the_runtimes_batches_and_keep_every_semantic(
    harness: Harness, workspace_id: str
) -> None:
    """Through the engine: runs in flight together go through `rt.committer` in shared statements,
    and each run keeps its own gap-free events, one trace per call and its own state updates."""

    async def tally(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.update_state({"rounds": [*ctx.state.get("rounds", []), ctx.round]})
        return {"ok": True}

    harness.tools.register("tally", tally)
    step = {"type": "llm", "name": "agent", "model": "scripted:rounds=3", "maxToolRounds": 3,
            "messages": [{"role": "user", "content": "tally"}], "tools": ["tally"]}  # fmt: skip
    def_id = await create_definition(harness.rt, workspace_id, {"name": "t", "version": "1", "steps": [step]})
    committer = harness.rt.committer
    batches_before, rows_before = committer.batches, committer.rows
    from stevora.engine import commands

    created = await asyncio.gather(*(commands.create_run(harness.rt, workspace_id, def_id) for _ in range(8)))
    for run_id in (run["id"] for run, _ in created):
        row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
        assert row["status"] == "COMPLETED", row["error"]
        assert row["state"]["rounds"] == [1, 2, 3]  # each run's own updates, each once
        events = await harness.events(run_id)
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
        traces = await harness.rt.pool.fetch(
            "SELECT round FROM tool_trace WHERE workflow_run_id = $1", run_id
        )
        assert sorted(t["round"] for t in traces) == [1, 2, 3]
    rows = committer.rows - rows_before
    assert rows == 8 * (3 + 4 + 1)  # three tool calls, four model calls and its completion per run
    assert committer.batches - batches_before < rows  # some statements carried several runs' rows


async def test_cancelling_the_first_caller_of_a_batch_never_strands_the_others(
    harness: Harness, workspace_id: str
) -> None:
    """The heartbeat cancels a run's task when its lease is revoked; the other runs whose rows
    share that caller's batch must still be written and woken."""
    anchors, pool, ids = await leased(harness, workspace_id, 3)
    gc = committer(pool)
    tasks = [asyncio.create_task(record_trace(gc, a, 700)) for a in anchors]
    for _ in range(3):  # the first caller has queued, waited its loop turn and handed the batch on
        await asyncio.sleep(0)
    tasks[0].cancel()
    await asyncio.wait_for(asyncio.gather(*tasks[1:]), 10)
    rows = await traces_of(pool, ids, 700)
    assert set(ids[1:]) <= {r["workflow_run_id"] for r in rows}
    await asyncio.gather(tasks[0], return_exceptions=True)
    await gc.drain()
    assert not gc._in_flight and not any(gc._queues.values())


async def test_a_lone_caller_cancelled_before_sending_writes_nothing_and_leaves_the_committer_usable(
    harness: Harness, workspace_id: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 1)
    gc = committer(pool)
    task = asyncio.create_task(record_trace(gc, anchors[0], 710))
    await asyncio.sleep(0)  # it is waiting its loop turn
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await traces_of(pool, ids, 710) == []
    await record_trace(gc, anchors[0], 711)  # nothing left "in flight"
    assert len(await traces_of(pool, ids, 711)) == 1


async def test_consecutive_checkpoints_keep_one_connection_and_give_it_back_when_idle(
    harness: Harness, workspace_id: str
) -> None:
    """One statement in flight at a time: the committer keeps one pool connection between them
    (no acquire + release per checkpoint) and returns it after HOLD_IDLE_S without checkpoints."""
    anchors, pool, ids = await leased(harness, workspace_id, 1)
    gc = committer(pool)
    await record_trace(gc, anchors[0], 720)
    kept = gc._conn
    assert kept is not None
    pids = set()
    for i in range(4):
        await record_trace(gc, anchors[0], 721 + i)
        assert gc._conn is kept
        pids.add(kept.get_server_pid())
    assert len(pids) == 1
    assert len(await traces_of(pool, ids, 724)) == 1
    await asyncio.sleep(group_commit.HOLD_IDLE_S * 2.5)
    for _ in range(100):  # a loaded machine may run the idle release late: wait for it, bounded
        if gc._conn is None and not gc._releasing:
            break
        await asyncio.sleep(0.05)
    assert gc._conn is None  # back in the pool
    assert not gc._releasing
    await record_trace(gc, anchors[0], 725)  # and taken again when needed
    assert gc._conn is not None
    await gc.drain()
    assert gc._conn is None and not gc._releasing


async def test_a_kept_connection_the_server_closed_is_replaced_and_the_checkpoint_written_once(
    harness: Harness, workspace_id: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 1)
    seq_before = await event_seqs(pool, ids)
    gc = committer(pool)
    await record_trace(gc, anchors[0], 730)
    kept = gc._conn
    assert kept is not None
    await pool.execute("SELECT pg_terminate_backend($1)", kept.get_server_pid())
    await asyncio.sleep(0.1)  # the socket closes under the kept connection
    await record_trace(gc, anchors[0], 731)  # a lost connection: retried on a fresh one
    assert gc._conn is not None and gc._conn is not kept
    assert len(await traces_of(pool, ids, 731)) == 1
    assert await event_seqs(pool, ids) == {ids[0]: seq_before[ids[0]] + 2}
    await gc.drain()


async def test_grouping_off_or_a_pool_of_one_keeps_no_connection(harness: Harness, workspace_id: str) -> None:
    anchors, pool, _ = await leased(harness, workspace_id, 1)
    gc = committer(pool, enabled=False)
    await record_trace(gc, anchors[0], 740)
    assert gc._conn is None
    single = await create_pool(harness.rt.settings.database_url, max_size=1)
    try:
        gc = committer(single)
        await record_trace(gc, anchors[0], 741)
        assert gc._conn is None
        assert await single.fetchval("SELECT 1") == 1  # the one connection is free
    finally:
        await single.close()


async def test_after_calm_lone_checkpoints_a_caller_sends_at_once_and_company_still_batches(
    harness: Harness, workspace_id: str
) -> None:
    """Lone checkpoints stop waiting a loop turn for company once nobody has joined for a while;
    callers that then arrive together still share statements, each row written once."""
    anchors, pool, ids = await leased(harness, workspace_id, 4)
    gc = committer(pool)
    for i in range(group_commit.CALM_WRITES):
        await record_trace(gc, anchors[0], 800 + i)
    assert gc._calm == group_commit.CALM_WRITES
    task = asyncio.create_task(record_trace(gc, anchors[0], 850))
    await asyncio.sleep(0)  # one turn: a calm lone caller has already sent its statement
    assert gc._in_flight and not any(gc._queues.values())
    await task
    batches = gc.batches
    await asyncio.gather(*(record_trace(gc, a, 860) for a in anchors))
    assert gc.batches - batches == 2  # the first went alone at once, the other three together
    assert gc._calm == 0  # they met: the next lone caller waits its turn again
    assert sorted(r["workflow_run_id"] for r in await traces_of(pool, ids, 860)) == sorted(ids)
    await gc.drain()


async def test_a_batch_stores_json_and_jsonb_values_as_the_single_row_statement_does(
    harness: Harness, workspace_id: str
) -> None:
    """The batch's document is jsonb; a `json` column (the tool's output, kept as written) still
    gets the bytes the single-row statement stores, key order included, and JSON null is SQL
    NULL in both; jsonb columns hold the same values."""
    anchors = await leased_runs(harness, workspace_id, 5)
    ids = [a["workflow_run_id"] for a in anchors]
    outputs: list[Any] = [
        {"b": 1, "a": [1, 2.5, None], "é": "x\ny"},
        "plain text",
        None,
        [3, {"z": {}, "y": True}],
        7,
    ]

    def recs(sequence: int) -> list[ToolTraceRecord]:
        out = [trace(a, sequence) for a in anchors]
        for rec, output in zip(out, outputs, strict=True):
            rec.output_json = output
            rec.input_json = {"zz": output, "aa": 1.25}
        return out

    batched = committer(harness.rt.pool)
    await asyncio.gather(
        *(
            checkpoints.record_tool_trace(batched, run_id, OWNER, rec, "TOOL_CALL_COMPLETED", {"k": 1})
            for run_id, rec in zip(ids, recs(470), strict=True)
        )
    )
    assert batched.batches < len(ids)  # several rows went in one statement
    lone = committer(harness.rt.pool)
    for run_id, rec in zip(ids, recs(471), strict=True):
        await checkpoints.record_tool_trace(lone, run_id, OWNER, rec, "TOOL_CALL_COMPLETED", {"k": 1})
    assert lone.batches == len(ids)  # one single-row statement each
    rows = await harness.rt.pool.fetch(
        "SELECT sequence, workflow_run_id, output_json::text AS output, input_json::text AS input "
        "FROM tool_trace WHERE sequence IN (470, 471) AND workflow_run_id = ANY($1::text[])",
        ids,
    )
    by_run = {(r["workflow_run_id"], r["sequence"]): r for r in rows}
    for run_id, output in zip(ids, outputs, strict=True):
        in_batch, alone = by_run[(run_id, 470)], by_run[(run_id, 471)]
        assert in_batch["output"] == alone["output"] == (None if output is None else dumps(output))
        assert in_batch["input"] == alone["input"]


def model_call(anchor: Any, round: int, k: int) -> LlmCallRecord:
    return LlmCallRecord(
        step_run_id=anchor["step_run_id"], step_name="agent", round=round, provider="scripted", model="m",
        status="completed", request={"messages": [k]}, duration_ms=1.0, response={"text": "hi"},
        input_tokens=10 * (k + 1), output_tokens=k + 1, cost_usd=0.001 * (k + 1),
    )  # fmt: skip


async def test_model_calls_and_tool_calls_queued_together_go_in_one_statement_each_row_fenced(
    harness: Harness, workspace_id: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 5)
    await pool.execute("UPDATE workflow_runs SET state = '{\"keep\": 1}' WHERE id = ANY($1::text[])", ids)
    await pool.execute("UPDATE workflow_runs SET lease_owner = 'someone-else' WHERE id = $1", ids[4])
    before = {
        r["id"]: r for r in await pool.fetch("SELECT * FROM workflow_runs WHERE id = ANY($1::text[])", ids)
    }
    counting = CountingPool(pool)
    gc = committer(counting)
    calls = [model_call(a, 60, k) for k, a in enumerate(anchors[:2])]
    results = await asyncio.gather(
        *(
            checkpoints.record_llm_call(gc, a["workflow_run_id"], OWNER, rec, "LLM_CALL_COMPLETED", {"k": k})
            for k, (a, rec) in enumerate(zip(anchors[:2], calls, strict=True))
        ),
        record_trace(gc, anchors[2], 600, state_updates={"n": 2}),
        record_trace(gc, anchors[3], 600),
        record_trace(gc, anchors[4], 600, state_updates={"n": 4}),  # its lease is someone else's
        return_exceptions=True,
    )
    assert counting.statements == [checkpoint_sql.PAIR_SQL] and gc.batches == 1
    assert isinstance(results[4], LeaseLost) and results[2:4] == [None, None]
    after = {
        r["id"]: r for r in await pool.fetch("SELECT * FROM workflow_runs WHERE id = ANY($1::text[])", ids)
    }
    for k, run_id in enumerate(ids[:2]):  # model calls: their sums added, the state as it was
        row = await pool.fetchrow("SELECT * FROM llm_calls WHERE id = $1", calls[k].id)
        assert results[k] == row["created_at"] and row["request"] == {"messages": [k]}
        assert after[run_id]["total_input_tokens"] == before[run_id]["total_input_tokens"] + 10 * (k + 1)
        assert after[run_id]["total_output_tokens"] == before[run_id]["total_output_tokens"] + k + 1
        assert after[run_id]["total_cost_cents"] == pytest.approx(
            before[run_id]["total_cost_cents"] + 0.1 * (k + 1)
        )
        assert after[run_id]["state"] == {"keep": 1}
    for run_id, state in ((ids[2], {"keep": 1, "n": 2}), (ids[3], {"keep": 1})):  # tool calls: sums kept
        assert after[run_id]["state"] == state
        for column in ("total_input_tokens", "total_output_tokens", "total_cost_cents"):
            assert after[run_id][column] == before[run_id][column]
    for run_id in ids[:4]:
        assert after[run_id]["event_seq"] == before[run_id]["event_seq"] + 1
        assert (
            await pool.fetchval(
                "SELECT count(*) FROM workflow_events WHERE workflow_run_id = $1 AND sequence = $2",
                run_id,
                after[run_id]["event_seq"],
            )
            == 1
        )
    assert after[ids[4]]["event_seq"] == before[ids[4]]["event_seq"] and after[ids[4]]["state"] == {"keep": 1}
    traces = await traces_of(pool, ids, 600)
    assert sorted(r["workflow_run_id"] for r in traces) == sorted(ids[2:4])


async def test_a_duplicate_in_a_statement_of_both_kinds_fails_only_its_own_caller(
    harness: Harness, workspace_id: str
) -> None:
    anchors, pool, ids = await leased(harness, workspace_id, 4)
    gc = committer(pool)
    await record_trace(gc, anchors[2], 610)
    calls = [model_call(a, 61, k) for k, a in enumerate(anchors[:2])]
    results = await asyncio.gather(
        *(
            checkpoints.record_llm_call(gc, a["workflow_run_id"], OWNER, rec, "LLM_CALL_COMPLETED", {})
            for a, rec in zip(anchors[:2], calls, strict=True)
        ),
        record_trace(gc, anchors[2], 610),  # already recorded: a unique violation
        record_trace(gc, anchors[3], 610),
        return_exceptions=True,
    )
    assert isinstance(results[2], asyncpg.UniqueViolationError) and results[3] is None
    assert all(not isinstance(r, BaseException) for r in results[:2])
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM llm_calls WHERE id = ANY($1::text[])", [c.id for c in calls]
        )
        == 2
    )
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM tool_trace WHERE sequence = 610 AND workflow_run_id = ANY($1::text[])", ids
        )
        == 2
    )


def _join_filter_rows(plan: dict[str, Any]) -> int:
    """Rows an EXPLAIN ANALYZE plan's joins compared and threw away, summed over its nodes."""
    return int(plan.get("Rows Removed by Join Filter", 0)) + sum(
        _join_filter_rows(p) for p in plan.get("Plans", [])
    )


async def test_a_batch_statement_does_linear_work_in_its_rows(harness: Harness, workspace_id: str) -> None:
    """A batch and a pair statement write their rows and return one row per run without
    joining their inserts back on the batch: the planner, which expects one row from a CTE, ran
    those joins as nested loops that compared every row with every other (O(rows²) per
    statement). Run under EXPLAIN ANALYZE in a transaction rolled back: no join throws away as
    many rows as the batch holds (12 runs: 264 before), every run's event is written and every run
    comes back once."""
    anchors, pool, ids = await leased(harness, workspace_id, 12)
    kinds = (checkpoint_sql.TOOL_TRACE, checkpoint_sql.LLM_CALL)

    def document(kind: checkpoint_sql.CheckpointKind, rows: list[Any], k: int) -> list[dict[str, Any]]:
        out = []
        for n, a in enumerate(rows):
            rec = trace(a, 900 + k) if kind is checkpoint_sql.TOOL_TRACE else model_call(a, 90 + k, n)
            values = kind.row(a["workflow_run_id"], OWNER, rec, (f"evt_lin{k}_{n}", "E", {"n": n}))
            row = dict(zip(kind.names, values, strict=True))
            for j in kind.json_text:
                row[kind.names[j]] = None if row[kind.names[j]] is None else dumps(row[kind.names[j]])
            out.append(row)
        return out

    statements = [(kind.batch_sql, [document(kind, anchors, k)]) for k, kind in enumerate(kinds)] + [
        (checkpoint_sql.PAIR_SQL, [document(kinds[1], anchors[:5], 2), document(kinds[0], anchors[5:], 3)])
    ]
    for sql, docs in statements:
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            try:
                explained = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *docs)
                plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]
                events = await conn.fetchval("SELECT count(*) FROM workflow_events WHERE id LIKE 'evt_lin%'")
            finally:
                await tx.rollback()
        assert plan["Plan"]["Actual Rows"] == events == len(ids)  # each run's event written, each run back
        # With PostgreSQL's default costs `i JOIN r` is a hash join (2.4 against a nested loop's 3.3 on
        # PostgreSQL 15): non-default `enable_*` or cost settings could fail this on the new SQL too.
        assert _join_filter_rows(plan["Plan"]) < len(ids)
