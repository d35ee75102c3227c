"""The live-text path without a model: `LiveText` publishes with pg_notify, the process's one
`LiveHub` LISTEN connection fans deltas out per run, survives its connection being killed (as in a
database restart), and a publish that fails never reaches the model call."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

from stevora.db.database import asyncpg_dsn
from stevora.engine import live_text
from stevora.engine.live_text import COALESCE_S, LiveText
from stevora.events import LLM_TEXT_CHANNEL
from stevora.live import LiveHub


def _live(pool: Any, run_id: str) -> LiveText:
    return LiveText(
        pool,
        run_id=run_id,
        step_run_id="srun_1",
        round_=1,
        model="m",
        provider="p",
        started=time.perf_counter(),
    )


async def _listener_pids(pool: Any) -> list[int]:
    rows = await pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE query = $1 AND pid <> pg_backend_pid()",
        f'LISTEN "{LLM_TEXT_CHANNEL}"',
    )
    return [r["pid"] for r in rows]


async def test_deltas_are_coalesced_in_order_and_reach_only_their_runs_subscribers(harness: Any) -> None:
    hub = LiveHub(asyncpg_dsn(harness.rt.settings.database_url))
    try:
        async with hub.subscribe("wfrun_a") as mine, hub.subscribe("wfrun_b") as other:
            live = _live(harness.rt.pool, "wfrun_a")
            live.text("Hel")  # the first piece goes at once
            for piece in ("lo", ", ", "wor", "ld"):  # then at most one publish per 50 ms
                live.text(piece)
            await live.aclose()
            received = [await asyncio.wait_for(mine.get(), 5)]
            while sum(len(d["text"]) for d in received) < len("Hello, world"):
                received.append(await asyncio.wait_for(mine.get(), 5))
            assert [d["text"] for d in received] == ["Hel", "lo, world"]
            assert [d["offset"] for d in received] == [0, 3]
            assert received[0] == {
                "runId": "wfrun_a", "stepRunId": "srun_1", "round": 1, "model": "m", "provider": "p",
                "text": "Hel", "offset": 0,
            }  # fmt: skip
            await asyncio.sleep(COALESCE_S * 2)
            assert other.empty()
    finally:
        await hub.aclose()


async def test_the_listener_reconnects_after_its_connection_is_killed(harness: Any) -> None:
    pool = harness.rt.pool
    hub = LiveHub(asyncpg_dsn(harness.rt.settings.database_url))
    others = set(await _listener_pids(pool))  # other hubs of this session, if any
    try:
        async with hub.subscribe("wfrun_r") as queue:
            [pid] = set(await _listener_pids(pool)) - others
            await pool.execute("SELECT pg_terminate_backend($1)", pid)
            deadline = time.monotonic() + 10
            while not set(await _listener_pids(pool)) - others - {pid}:
                assert time.monotonic() < deadline, "the hub did not LISTEN again"
                await asyncio.sleep(0.1)
            live = _live(pool, "wfrun_r")
            live.text("after the restart")
            await live.aclose()
            delta = await asyncio.wait_for(queue.get(), 5)
            assert delta["text"] == "after the restart"
    finally:
        await hub.aclose()


async def test_a_failed_publish_is_swallowed(harness: Any) -> None:
    dead = await asyncpg.create_pool(asyncpg_dsn(harness.rt.settings.database_url), min_size=0, max_size=1)
    await dead.close()
    live = _live(dead, "wfrun_x")
    live.first_token()
    live.text("nobody hears this")
    await live.aclose()  # no exception: deltas are ephemeral
    assert live.time_to_first_token_ms is not None and live.time_to_first_token_ms >= 0


async def test_the_deltas_of_many_calls_share_statements_and_keep_their_order(
    harness: Any, monkeypatch: Any
) -> None:
    statements: list[int] = []
    send = live_text.notify_many

    async def counted(pool: Any, channel: str, payloads: list[str]) -> None:
        statements.append(len(payloads))
        await send(pool, channel, payloads)

    monkeypatch.setattr(live_text, "notify_many", counted)
    hub = LiveHub(asyncpg_dsn(harness.rt.settings.database_url))
    try:
        async with hub.subscribe("wfrun_many") as mine:
            calls = [_live(harness.rt.pool, "wfrun_many") for _ in range(40)]
            for i, live in enumerate(calls):
                live.text(f"{i}:a")  # each call's first delta goes at once
            await asyncio.sleep(COALESCE_S * 1.5)
            for i, live in enumerate(calls):
                live.text(f"{i}:b")
            started = time.perf_counter()
            await asyncio.gather(*(live.aclose() for live in calls))
            assert time.perf_counter() - started < live_text.LINGER_S * 5  # an ending call does not linger
            received = [await asyncio.wait_for(mine.get(), 5) for _ in range(80)]
    finally:
        await hub.aclose()
    assert sum(statements) == 80 and len(statements) <= 4, statements  # not one statement per delta
    firsts = [d["text"] for d in received[:40]]
    assert firsts == [f"{i}:a" for i in range(40)]  # in the order they were published
    assert sorted(d["text"] for d in received[40:]) == sorted(f"{i}:b" for i in range(40))
