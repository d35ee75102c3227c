"""An in-process dispatcher that hands runs straight to a RunPool on the same event loop.

Used by tests and embedded tools that want real claims, leases and transitions without a
broker hop. Delays become `loop.call_later`; like a broker message they are only hints.
"""

from __future__ import annotations

import asyncio

from stevora.engine.run_pool import RunPool


class InlineDispatcher:
    def __init__(self) -> None:
        self.run_pool: RunPool | None = None
        self.sent: list[tuple[str, int]] = []
        self._pending: set[asyncio.Task[bool]] = set()

    def _submit(self, run_id: str) -> None:
        if self.run_pool is None:
            return
        task = asyncio.get_running_loop().create_task(self.run_pool.submit(run_id))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def dispatch(self, run_id: str, *, delay_ms: int = 0) -> None:
        self.sent.append((run_id, delay_ms))
        if delay_ms > 0:
            asyncio.get_running_loop().call_later(delay_ms / 1000, self._submit, run_id)
        else:
            self._submit(run_id)
