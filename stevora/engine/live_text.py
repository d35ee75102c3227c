"""A streamed model call's live side: time to first token, and text deltas published to the API.

The worker and the API are different processes, so deltas travel by PostgreSQL `NOTIFY` on
`LLM_TEXT_CHANNEL` (no new infrastructure). They are ephemeral — the stored `LLM_CALL_COMPLETED` is the
truth — so publishing is fire-and-forget: a failed publish is logged at debug and never fails the
call. Deltas are coalesced: the first goes at once, later ones at most every `COALESCE_S` per call,
each under PostgreSQL's 8000-byte payload limit (split by encoded size). A call that streams no text (tool calls
only, or a provider that does not stream) publishes nothing, so it costs no database round trip.

The deltas of all the calls of a process go out through one `Publisher` per pool: one statement
carries every delta queued while the previous one was on its way (`notify_many`, in order), so
2,000 streaming calls in flight cost a few statements per tick, not one per call and delta
(docs/benchmarks.md, "Many slow LLM calls in one worker process").

A call that ends waits for its own deltas only (each publish has a sequence number), and at most
`CLOSE_WAIT_S`: live text never holds a checkpoint for long. Past that its deltas not yet in a
statement are dropped, so none arrives long after the stored answer. A backlog beyond `MAX_QUEUED`
(the database slower than the deltas come) drops its oldest deltas, logged as
`llm_text_deltas_dropped`. A payload the server refuses (a statement fails with a data error) is
found by splitting the statement and skipped alone: the other calls' deltas still go out.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import time
from collections import deque
from typing import TYPE_CHECKING

import asyncpg
import structlog

from stevora.db.database import notify_many
from stevora.events import LLM_TEXT_CHANNEL

if TYPE_CHECKING:
    from stevora.observability.hooks import ModelCallObservation

COALESCE_S = 0.05
# A payload (JSON, UTF-8, not ASCII-escaped) must stay under PostgreSQL's 8000 bytes: a piece of
# text is cut at MAX_CHARS characters, then halved until its payload has at most PAYLOAD_BYTES.
PAYLOAD_BYTES = 7900
MAX_CHARS = 2000
BATCH = 500  # notifications per statement at most
# A longer backlog drops its oldest deltas (ephemeral: the stored events are the truth).
MAX_QUEUED = 10 * BATCH
# A statement waits this long for more deltas to carry, unless a call's end waits for it (aclose).
LINGER_S = 0.02
CLOSE_WAIT_S = 0.25  # a call's end waits this long at most for its deltas, then its checkpoint goes on

log = structlog.get_logger("stevora.engine")


class Publisher:
    """Sends the deltas of every call on one pool, in the order they were queued: one statement
    at a time, each carrying what was queued meanwhile (at most `BATCH`). A statement leaves
    `LINGER_S` after its first delta was queued, or at once when it is full or a call that ends
    waits for it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        # (sequence number, payload, its call): the call's deltas are skipped once it gave up on them
        self._queued: deque[tuple[int, str, LiveText | None]] = deque()
        self._next = 0  # the sequence number of the next publish
        self._done = 0  # every publish numbered below this was sent (or dropped, or failed)
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # heap of (number, id, future)
        self._sender: asyncio.Task[None] | None = None
        self._linger: asyncio.Future[None] | None = None  # the sender waits on it before a statement
        self._hurry = False
        self.dropped = 0  # deltas dropped from a backlog over MAX_QUEUED
        self._dropped_unlogged = 0

    def hurry(self) -> None:
        """A call waits for its deltas (its end): send what is queued without lingering."""
        self._hurry = True
        if self._linger is not None and not self._linger.done():
            self._linger.set_result(None)

    def publish(self, payload: str, owner: LiveText | None = None) -> int:
        """Queue `payload`; its sequence number, for `sent`. Deltas are ephemeral: a failure is
        logged and swallowed, and the oldest of a backlog over `MAX_QUEUED` are dropped."""
        seq = self._next
        self._next += 1
        self._queued.append((seq, payload, owner))
        if len(self._queued) > MAX_QUEUED:
            self._queued.popleft()
            self.dropped += 1
            self._dropped_unlogged += 1
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all())
        return seq

    def sent(self, seq: int) -> asyncio.Future[None] | None:
        """A future resolved once publish `seq` and those before it are sent (or dropped); None if
        they are already."""
        if seq < self._done:
            return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (seq, id(future), future))
        return future

    def _settle_waiting(self) -> None:
        while self._waiting and self._waiting[0][0] < self._done:
            _settle(heapq.heappop(self._waiting)[2])

    async def _send_all(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queued:
                if not self._hurry and len(self._queued) < BATCH:  # a full statement goes at once
                    self._linger = linger = loop.create_future()
                    timer = loop.call_later(LINGER_S, _settle, linger)
                    try:
                        await linger
                    finally:
                        timer.cancel()
                        self._linger = None
                self._hurry = False
                taken = [self._queued.popleft() for _ in range(min(BATCH, len(self._queued)))]
                payloads = [p for _, p, owner in taken if owner is None or not owner.abandoned]
                if payloads:
                    await self._send(payloads)
                # what is before the queue's head was sent, or dropped while this statement ran
                self._done = self._queued[0][0] if self._queued else self._next
                self._settle_waiting()
                if self._dropped_unlogged:
                    log.warning("llm_text_deltas_dropped", deltas=self._dropped_unlogged, backlog=MAX_QUEUED)
                    self._dropped_unlogged = 0
        finally:
            self._sender = None
            if _publishers.get(self._pool) is self:
                del _publishers[self._pool]
            self._queued.clear()  # cancelled (the loop is closing): nobody waits on them
            self._done = self._next
            self._settle_waiting()

    async def _send(self, payloads: list[str]) -> None:
        try:
            await notify_many(self._pool, LLM_TEXT_CHANNEL, payloads)
        except (asyncpg.DataError, UnicodeError) as exc:  # a payload refused: find it, send the others
            if len(payloads) == 1:
                log.debug("llm_text_delta_not_published", error=str(exc), deltas=1)
                return
            half = len(payloads) // 2
            await self._send(payloads[:half])
            await self._send(payloads[half:])
        except Exception as exc:  # ephemeral by design: the stored events are the truth
            log.debug("llm_text_delta_not_published", error=str(exc), deltas=len(payloads))


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# The publishers with something to send (one per pool; pools are bound to their loop): an idle
# publisher is dropped, and the next delta starts a new one after the last statement ended.
_publishers: dict[asyncpg.Pool, Publisher] = {}


def publisher(pool: asyncpg.Pool) -> Publisher:
    """The pool's `Publisher`."""
    found = _publishers.get(pool)
    if found is None:
        found = _publishers[pool] = Publisher(pool)
    return found


class LiveText:
    """The `StreamSink` of one model call attempt (see `stevora.llm.streaming`)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        run_id: str,
        step_run_id: str,
        round_: int,
        model: str,
        provider: str,
        started: float,
    ) -> None:
        self._pool = pool
        self._envelope = {
            "runId": run_id,
            "stepRunId": step_run_id,
            "round": round_,
            "model": model,
            "provider": provider,
        }
        self._started = started
        self.observation: ModelCallObservation | None = None
        self.first_token_at: float | None = None
        self._pending: list[str] = []
        self._offset = 0  # characters of the answer's text published so far
        self._last_flush = -1.0e9
        self._timer: asyncio.TimerHandle | None = None
        self._last_send: tuple[Publisher, int] | None = None  # the publisher and number of the last delta
        self.abandoned = False  # its end stopped waiting: its deltas not yet sent are skipped

    @property
    def time_to_first_token_ms(self) -> float | None:
        if self.first_token_at is None:
            return None
        return (self.first_token_at - self._started) * 1000

    def first_token(self) -> None:
        self.first_token_at = time.perf_counter()
        if self.observation is not None:
            self.observation.first_token()

    def text(self, piece: str) -> None:
        self._pending.append(piece)
        if self._timer is not None:
            return  # a flush is already due; this piece joins it
        wait_s = self._last_flush + COALESCE_S - time.perf_counter()
        if wait_s <= 0:
            self._flush()
        else:
            self._timer = asyncio.get_running_loop().call_later(wait_s, self._flush)

    def _flush(self) -> None:
        self._timer = None
        text = "".join(self._pending)
        self._pending.clear()
        if not text:
            return
        self._last_flush = time.perf_counter()
        for start in range(0, len(text), MAX_CHARS):
            self._publish(text[start : start + MAX_CHARS])

    def _publish(self, piece: str) -> None:
        payload = json.dumps({**self._envelope, "text": piece, "offset": self._offset}, ensure_ascii=False)
        if len(piece) > 1 and len(payload.encode("utf-8", "surrogatepass")) > PAYLOAD_BYTES:
            half = len(piece) // 2  # CJK is 3 bytes a character, emoji 4, control characters 6
            self._publish(piece[:half])
            self._publish(piece[half:])
            return
        self._offset += len(piece)
        # One sender per pool, one statement at a time: deltas reach listeners in order.
        found = publisher(self._pool)
        self._last_send = (found, found.publish(payload, self))

    async def aclose(self) -> None:
        """Publish what is still pending and wait for it, so deltas precede the call's checkpoint;
        at most `CLOSE_WAIT_S`, then what is not yet in a statement is skipped."""
        if self._timer is not None:
            self._timer.cancel()
        if self._pending:  # nothing streamed (tool calls only, or no streaming): nothing to send
            self._flush()
        if self._last_send is None:
            return
        found, seq = self._last_send
        sent = found.sent(seq)
        if sent is None:
            return
        found.hurry()
        with contextlib.suppress(BaseException):
            try:
                await asyncio.wait_for(asyncio.shield(sent), CLOSE_WAIT_S)
            except TimeoutError:
                self.abandoned = True
                log.debug("llm_text_deltas_abandoned", run_id=self._envelope["runId"])
