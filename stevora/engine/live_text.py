"""A streamed model call's live side: time to first token, and text deltas published to the API.

The worker and the API are different processes, so deltas travel by PostgreSQL `NOTIFY` on
`LLM_TEXT_CHANNEL` (no new infrastructure). They are ephemeral — the stored `LLM_CALL_COMPLETED` is the
truth — so publishing is fire-and-forget: a failed publish is logged at debug and never fails the
call. Deltas are coalesced: the first goes at once, later ones at most every `COALESCE_S` per call,
each well under PostgreSQL's 8000-byte payload limit. A call that streams no text (tool calls
only, or a provider that does not stream) publishes nothing, so it costs no database round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING

import structlog

from stevora.db.database import notify
from stevora.events import LLM_TEXT_CHANNEL

if TYPE_CHECKING:
    import asyncpg

    from stevora.observability.hooks import ModelCallObservation

COALESCE_S = 0.05
# Characters per notification: at most 4 UTF-8 bytes each, plus the JSON envelope, stays < 8000.
MAX_CHARS = 1500

log = structlog.get_logger("stevora.engine")


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
        self._last_send: asyncio.Task[None] | None = None

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
            # Chained, so deltas reach listeners in order even over different pool connections.
            self._last_send = asyncio.create_task(self._send(payload, self._last_send))

    async def _send(self, payload: str, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            with contextlib.suppress(BaseException):
                await previous
        try:
            await notify(self._pool, LLM_TEXT_CHANNEL, payload)
        except Exception as exc:  # ephemeral by design: the stored events are the truth
            log.debug("llm_text_delta_not_published", error=str(exc))

    async def aclose(self) -> None:
        """Publish what is still pending and wait for it, so deltas precede the call's checkpoint."""
        if self._timer is not None:
            self._timer.cancel()
        if self._pending:  # nothing streamed (tool calls only, or no streaming): nothing to send
            self._flush()
        if self._last_send is not None:
            with contextlib.suppress(BaseException):
                await self._last_send
