"""Live text deltas of streamed model calls, from the workers to this process's SSE streams.

Workers publish each delta with `pg_notify` (stevora.engine.live_text). This process holds ONE
listening connection, opened when the first stream subscribes and reopened after it is lost (a
database restart), and fans every delta out to the streams of its run. Deltas are ephemeral: a
stream that is slow, or was not connected, misses them; the stored events are the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import structlog

from stevora.events import LLM_TEXT_CHANNEL, LLM_TEXT_DELTA, TOOL_PROGRESS

log = structlog.get_logger("stevora.api")

QUEUE_SIZE = 1000  # deltas buffered per stream; past that a slow reader misses some
RECONNECT_S = 1.0
CHECK_S = 5.0  # how often a quiet listening connection is checked for having died
READY_WAIT_S = 2.0  # a new subscriber waits this long at most for LISTEN to be in place

Delta = dict[str, Any]


class LiveHub:
    """One `LISTEN` connection per process, fanned out to per-run subscriber queues."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._subscribers: dict[str, set[asyncio.Queue[Delta]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    @contextlib.asynccontextmanager
    async def subscribe(self, run_id: str) -> AsyncIterator[asyncio.Queue[Delta]]:
        """A queue of the run's deltas while the context is open."""
        queue: asyncio.Queue[Delta] = asyncio.Queue(QUEUE_SIZE)
        self._subscribers.setdefault(run_id, set()).add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="stevora-live-text")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), READY_WAIT_S)
        try:
            yield queue
        finally:
            queues = self._subscribers.get(run_id)
            if queues is not None:
                queues.discard(queue)
                if not queues:
                    del self._subscribers[run_id]

    async def _listen(self) -> None:
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._dsn)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(LLM_TEXT_CHANNEL, self._deliver)
                self._listening.set()
                while not conn.is_closed():  # the termination callback, or a periodic look
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), CHECK_S)
            except Exception as exc:  # the database is away: streams go on with stored events
                log.debug("live_text_listener_lost", error=str(exc))
            finally:
                self._listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
            await asyncio.sleep(RECONNECT_S)

    def _deliver(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            delta = json.loads(payload)
        except ValueError:
            return
        for queue in self._subscribers.get(str(delta.get("runId")), ()):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(delta)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None


def drain(queue: asyncio.Queue[Delta]) -> list[Delta]:
    """The deltas already waiting (sent before the stored events read after them)."""
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


async def deltas_for(queue: asyncio.Queue[Delta], seconds: float) -> AsyncIterator[Delta]:
    """Deltas as they arrive, for `seconds` (a stream's poll interval), then return."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            yield await asyncio.wait_for(queue.get(), left)
        except TimeoutError:
            return


def delta_sse(delta: Delta) -> str:
    """One delta as an SSE message: its own event name and no `id:` (Last-Event-ID is for stored events).
    An MCP call's progress (`"event": "tool.progress"` in the payload) goes out under that name."""
    name = TOOL_PROGRESS if delta.get("event") == TOOL_PROGRESS else LLM_TEXT_DELTA
    return f"event: {name}\ndata: {json.dumps(delta, separators=(',', ':'))}\n\n"
