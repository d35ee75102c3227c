"""The live-text path without a model: `LiveText` publishes with pg_notify, the process's one
`LiveHub` LISTEN connection fans deltas out per run, survives its connection being killed (as in a
database restart), and a publish that fails never reaches the model call."""

from __future__ import annotations

import asyncio
import json
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


class _SlowPool:
    """Stands in for a pool: each statement takes `seconds`, or waits for the test to let it go."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.sent: list[str] = []
        self.go: asyncio.Queue[None] | None = None  # one item per statement allowed to finish
        self.statements = 0


def _slow_notify(monkeypatch: Any) -> None:
    async def slow(pool: _SlowPool, channel: str, payloads: list[str]) -> None:
        pool.statements += 1
        if pool.go is not None:
            await pool.go.get()
        await asyncio.sleep(pool.seconds)
        pool.sent.extend(payloads)

    monkeypatch.setattr(live_text, "notify_many", slow)


async def _statements(pool: _SlowPool, count: int) -> None:
    """Let `count` more statements finish, one after the other."""
    assert pool.go is not None
    for _ in range(count):
        target = pool.statements + 1
        pool.go.put_nowait(None)
        deadline = time.monotonic() + 5
        while pool.statements < target and live_text._publishers.get(pool):  # type: ignore[call-overload]
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)  # until the next statement started, or the publisher is idle


async def test_an_ending_call_waits_for_its_own_deltas_not_the_backlog(monkeypatch: Any) -> None:
    _slow_notify(monkeypatch)
    monkeypatch.setattr(live_text, "CLOSE_WAIT_S", 30.0)  # the bound is another test's
    pool = _SlowPool()
    pool.go = asyncio.Queue()
    found = live_text.publisher(pool)  # type: ignore[arg-type]
    for n in range(1200):  # other calls' backlog: statements 1-3 carry it (500 each)
        found.publish(f"other {n}")
    live = _live(pool, "wfrun_mine")
    live.text("my last words")  # number 1200: in statement 3
    closing = asyncio.create_task(live.aclose())
    for _ in range(3):
        for n in range(600):  # more than a statement carries keeps coming meanwhile
            found.publish(f"later {n}")
        await _statements(pool, 1)
    await asyncio.sleep(0.01)
    assert closing.done()  # it did not wait for the backlog queued after it
    assert any("my last words" in p for p in pool.sent)
    assert not live.abandoned
    pool.seconds = 0.0
    while live_text._publishers.get(pool):  # type: ignore[call-overload]
        await _statements(pool, 1)


async def test_the_backlog_is_capped_dropping_the_oldest(monkeypatch: Any) -> None:
    _slow_notify(monkeypatch)
    pool = _SlowPool()
    pool.go = asyncio.Queue()
    found = live_text.publisher(pool)  # type: ignore[arg-type]
    first = found.publish("first")
    await asyncio.sleep(live_text.LINGER_S * 2)  # the first statement is on its way (and waits)
    numbers = [found.publish(f"d{n}") for n in range(live_text.MAX_QUEUED + 100)]
    assert len(found._queued) == live_text.MAX_QUEUED and found.dropped == 100
    waiting = [found.sent(first), found.sent(numbers[99]), found.sent(numbers[100])]
    await _statements(pool, 1)
    await asyncio.sleep(0.01)
    assert [w is not None and w.done() for w in waiting] == [True, True, False]  # dropped count as done
    while live_text._publishers.get(pool):  # type: ignore[call-overload]
        await _statements(pool, 1)
    assert pool.sent == ["first"] + [f"d{n}" for n in range(100, live_text.MAX_QUEUED + 100)]
    assert waiting[2] is not None and waiting[2].done()


async def test_a_full_statement_does_not_linger(monkeypatch: Any) -> None:
    _slow_notify(monkeypatch)
    pool = _SlowPool()
    found = live_text.publisher(pool)  # type: ignore[arg-type]
    for n in range(live_text.BATCH * 2):
        found.publish(f"d{n}")
    await asyncio.sleep(live_text.LINGER_S / 2)
    assert pool.statements == 2 and len(pool.sent) == live_text.BATCH * 2  # not 500 per 20 ms


async def test_an_ending_call_waits_at_most_close_wait_s(monkeypatch: Any) -> None:
    _slow_notify(monkeypatch)
    pool = _SlowPool(0.6)  # a statement that hangs
    first = _live(pool, "wfrun_first")
    first.text("in the statement that hangs")
    await asyncio.sleep(live_text.LINGER_S * 2)
    live = _live(pool, "wfrun_mine")
    live.text("queued behind it")
    started = time.perf_counter()
    await live.aclose()
    assert time.perf_counter() - started < live_text.CLOSE_WAIT_S + 0.2
    assert live.abandoned
    await first.aclose()
    await asyncio.sleep(pool.seconds * 2.2)
    assert not any("queued behind it" in p for p in pool.sent)  # not sent long after its checkpoint


async def _listen(harness: Any) -> tuple[Any, list[str]]:
    heard: list[str] = []
    conn = await asyncpg.connect(asyncpg_dsn(harness.rt.settings.database_url))
    await conn.add_listener(LLM_TEXT_CHANNEL, lambda *args: heard.append(args[3]))
    return conn, heard


async def _heard_all(heard: list[str], count: int) -> None:
    for _ in range(250):  # 5 s at most
        if len(heard) >= count:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # and nothing more


async def test_cjk_and_emoji_deltas_fit_the_payload_limit_beside_other_calls(harness: Any) -> None:
    conn, heard = await _listen(harness)
    try:
        answer = "🎉🚀" * 1000 + "退款政策说明" * 500 + "end"  # 2,000 emoji (8,000 bytes), 3,000 CJK
        big, small = _live(harness.rt.pool, "wfrun_big"), _live(harness.rt.pool, "wfrun_small")
        small.text("before")
        await asyncio.sleep(COALESCE_S * 1.5)
        small.text(" after")
        big.text(answer)  # one flush, several KB of non-Latin text, in the statement with `small`'s
        await asyncio.gather(big.aclose(), small.aclose())
        await _heard_all(heard, 3)
        deltas = [json.loads(p) for p in heard]
    finally:
        await conn.close()
    assert all(len(p.encode()) < 8000 for p in heard)
    assert [d["text"] for d in deltas if d["runId"] == "wfrun_small"] == ["before", " after"]
    mine = [d for d in deltas if d["runId"] == "wfrun_big"]
    assert [d["offset"] for d in mine] == sorted(d["offset"] for d in mine)  # in order, as published
    assert "".join(d["text"] for d in mine) == answer
    offset = 0
    for d in mine:
        assert d["offset"] == offset
        offset += len(d["text"])
    assert len(mine) <= 4  # cut by bytes, not into tiny pieces


async def test_a_refused_payload_is_skipped_alone(harness: Any) -> None:
    conn, heard = await _listen(harness)
    try:
        calls = [_live(harness.rt.pool, f"wfrun_{i}") for i in range(20)]
        found = live_text.publisher(harness.rt.pool)
        for i, live in enumerate(calls):
            live.text(f"{i}")
            if i == 10:
                found.publish("x" * 9000)  # over the limit: the server refuses the statement
        await asyncio.gather(*(live.aclose() for live in calls))
        await _heard_all(heard, 20)
    finally:
        await conn.close()
    assert [json.loads(p)["text"] for p in heard] == [f"{i}" for i in range(20)]  # the others, in order
