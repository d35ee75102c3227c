"""A streamed model call's live side: time to first token, and text deltas published to the API.

The worker and the API are different processes, so deltas travel by PostgreSQL `NOTIFY` on
`LLM_TEXT_CHANNEL` (no new infrastructure). They are ephemeral — the stored `LLM_CALL_COMPLETED` is the
truth — so publishing is fire-and-forget: a failed publish is logged at debug and never fails the
call. Deltas are coalesced: the first goes at once, later ones at most every `COALESCE_S` per call,
each well under PostgreSQL's 8000-byte payload limit. A call that streams no text (tool calls
only, or a provider that does not stream) publishes nothing, so it costs no database round trip.

The deltas of all the calls of a process go out through one `Publisher` per pool: one statement
carries every delta queued while the previous one was on its way (`notify_many`, in order), so
2,000 streaming calls in flight cost a few statements per tick, not one per call and delta
(docs/benchmarks.md, "Many slow LLM calls in one worker process").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING

import structlog

from stevora.db.database import notify_many
from stevora.events import LLM_TEXT_CHANNEL

if TYPE_CHECKING:
    import asyncpg

    from stevora.observability.hooks import ModelCallObservation

COALESCE_S = 0.05
# Characters per notification: at most 4 UTF-8 bytes each, plus the JSON envelope, stays < 8000.
MAX_CHARS = 1500
BATCH = 500  # notifications per statement at most
# A statement waits this long for more deltas to carry, unless a call's end waits for it (aclose).
LINGER_S = 0.02

log = structlog.get_logger("stevora.engine")


class Publisher:
    """Sends the deltas of every call on one pool, in the order they were queued: one statement
    at a time, each carrying all that was queued meanwhile (at most `BATCH`). A statement leaves
    `LINGER_S` after its first delta was queued, or at once when a call that ends waits for it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._queued: list[str] = []
        self._sent: asyncio.Future[None] | None = None  # resolved once `_queued` is sent
        self._sender: asyncio.Task[None] | None = None
        self._linger: asyncio.Future[None] | None = None  # the sender waits on it before a statement
        self._hurry = False

    def hurry(self) -> None:
        """A call waits for its deltas (its end): send what is queued without lingering."""
        self._hurry = True
        if self._linger is not None and not self._linger.done():
            self._linger.set_result(None)

    def publish(self, payload: str) -> asyncio.Future[None]:
        """Queue `payload`; the future resolves once it was sent (or failed to be: deltas are
        ephemeral, a failure is logged and swallowed)."""
        if self._sent is None:
            self._sent = asyncio.get_running_loop().create_future()
        self._queued.append(payload)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all())
        return self._sent

    async def _send_all(self) -> None:
        sent: asyncio.Future[None] | None = None
        loop = asyncio.get_running_loop()
        try:
            while self._queued:
                if not self._hurry:
                    self._linger = linger = loop.create_future()
                    timer = loop.call_later(LINGER_S, _settle, linger)
                    try:
                        await linger
                    finally:
                        timer.cancel()
                        self._linger = None
                self._hurry = False
                payloads, self._queued = self._queued[:BATCH], self._queued[BATCH:]
                sent = self._sent
                if not self._queued:  # what is queued from now on waits for the next statement
                    self._sent = None
                try:
                    await notify_many(self._pool, LLM_TEXT_CHANNEL, payloads)
                except Exception as exc:  # ephemeral by design: the stored events are the truth
                    log.debug("llm_text_delta_not_published", error=str(exc), deltas=len(payloads))
                if sent is not None and sent is not self._sent:
                    sent.set_result(None)
                sent = None
        finally:
            self._sender = None
            if _publishers.get(self._pool) is self:
                del _publishers[self._pool]
            for waiting in (sent, self._sent):  # cancelled (the loop is closing): nobody waits on
                if waiting is not None and not waiting.done():
                    waiting.set_result(None)
            self._queued, self._sent = [], None


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
        self._last_send: asyncio.Future[None] | None = None

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
            piece = text[start : start + MAX_CHARS]
            payload = json.dumps({**self._envelope, "text": piece, "offset": self._offset})
            self._offset += len(piece)
            # One sender per pool, one statement at a time: deltas reach listeners in order.
            self._last_send = publisher(self._pool).publish(payload)

    async def aclose(self) -> None:
        """Publish what is still pending and wait for it, so deltas precede the call's checkpoint."""
        if self._timer is not None:
            self._timer.cancel()
        if self._pending:  # nothing streamed (tool calls only, or no streaming): nothing to send
            self._flush()
        if self._last_send is not None:
            if not self._last_send.done():
                found = _publishers.get(self._pool)
                if found is not None:
                    found.hurry()
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._last_send)
