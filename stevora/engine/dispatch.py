"""How the engine asks a worker to look at a run: by actor name, carrying only the run id.

`stevora` never imports `workers`; it builds the Dramatiq message itself. A lost or duplicated
message is harmless: the run row is the truth, claims are leased, and the sweep re-dispatches.
"""

from __future__ import annotations

import asyncio

import dramatiq

from stevora.runtime import Dispatcher

QUEUE_NAME = "stevora"
EXECUTE_RUN_ACTOR = "execute_run"

__all__ = ["EXECUTE_RUN_ACTOR", "QUEUE_NAME", "Dispatcher", "DramatiqDispatcher", "RecordingDispatcher"]


class DramatiqDispatcher:
    def __init__(self, broker: dramatiq.Broker, queue_name: str = QUEUE_NAME) -> None:
        self.broker = broker
        self.queue_name = queue_name
        broker.declare_queue(queue_name)

    def send(self, actor_name: str, *args: str, delay_ms: int = 0) -> None:
        message: dramatiq.Message[None] = dramatiq.Message(
            queue_name=self.queue_name, actor_name=actor_name, args=args, kwargs={}, options={}
        )
        self.broker.enqueue(message, delay=delay_ms or None)

    async def dispatch(self, run_id: str, *, delay_ms: int = 0) -> None:
        # Broker clients (pika, redis) block; keep them off the event loop.
        await asyncio.to_thread(self.send, EXECUTE_RUN_ACTOR, run_id, delay_ms=delay_ms)

    async def dispatch_many(self, run_ids: list[str]) -> None:
        """Wake-ups for many runs in one hop off the event loop (a due pass's batch)."""
        await asyncio.to_thread(self._send_all, run_ids)

    def _send_all(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            self.send(EXECUTE_RUN_ACTOR, run_id)


class RecordingDispatcher:
    """Keeps dispatches in a list; for tests that drive runs by hand."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    async def dispatch(self, run_id: str, *, delay_ms: int = 0) -> None:
        self.sent.append((run_id, delay_ms))
