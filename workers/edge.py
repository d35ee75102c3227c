"""Dramatiq middleware that owns this process's Runtime, RunPool and recovery sweep.

They live on the AsyncIO middleware's event loop thread (asyncpg pools are loop-bound), are
started as the worker boots and stopped before it shuts down; on shutdown every held lease
is handed back and its run re-dispatched so another worker resumes it at once.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any

import dramatiq
import structlog
from dramatiq.asyncio import get_event_loop_thread

from stevora.engine import mcp_servers
from stevora.engine.dispatch import DramatiqDispatcher
from stevora.engine.run_pool import RunPool
from stevora.engine.sweep import sweep_forever
from stevora.observability import tracing
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.triggers.loop import triggers_forever
from stevora.tuning import tune_gc
from stevora.webhooks.address import check_webhook_url

log = structlog.get_logger("stevora.worker")


@dataclass
class WorkerState:
    runtime: Runtime
    run_pool: RunPool
    sweeper: asyncio.Task[Any]
    mcp_publisher: asyncio.Task[None] | None = None


_state: WorkerState | None = None


def current() -> WorkerState:
    if _state is None:
        raise RuntimeError("the Stevora worker runtime is not started in this process")
    return _state


def load_tool_modules(modules: list[str]) -> list[str]:
    """Import user modules so their register_tool / @tool / register_task_handler calls run;
    returns the module names imported.

    The working directory is importable, as with `uvicorn --app-dir .`. A file path
    (`./my_tools.py`) is imported as the module its file name names, from its folder."""
    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    names = []
    for given in modules:
        name = module_name(given)
        importlib.import_module(name)
        log.info("tool_module_loaded", module=name)
        names.append(name)
    return names


def module_name(given: str) -> str:
    """`given` as an importable module name: a `.py` file path puts its folder on `sys.path`."""
    if not given.endswith(".py") and os.sep not in given and "/" not in given:
        return given
    path = os.path.abspath(given)
    if not os.path.isfile(path):
        raise ModuleNotFoundError(f"No tools file {given!r} (looked for {path})")
    folder, file = os.path.split(path)
    name = file.removesuffix(".py")
    if not name.isidentifier():
        raise ModuleNotFoundError(f"Tools file {given!r}: {file!r} is not an importable module name")
    loaded = sys.modules.get(name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") != path:
        raise ModuleNotFoundError(
            f"Tools file {given!r}: a different module named {name!r} is already imported "
            f"({getattr(loaded, '__file__', None) or 'built in'}); rename the file"
        )
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return name


async def _background(rt: Runtime) -> None:
    """The recovery sweep and the trigger pass (schedules, debounce / batch groups)."""
    await asyncio.gather(sweep_forever(rt), triggers_forever(rt))


class StevoraWorkerMiddleware(dramatiq.Middleware):
    def __init__(self, settings: Settings, *, sweep: bool = True) -> None:
        self.settings = settings
        self.sweep = sweep

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        # Runs after the AsyncIO middleware made its loop thread (it is earlier in the list) and
        # before consumers start, so no message can arrive before the runtime exists.
        loop_thread = get_event_loop_thread()
        assert loop_thread is not None, "the AsyncIO middleware must come before this one"
        loop_thread.run_coroutine(self._start(broker))

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        # Consumers and worker threads are stopped by now, so no message arrives to find the
        # runtime gone; `after_*` hooks run in reverse order, so the AsyncIO loop is still up.
        loop_thread = get_event_loop_thread()
        if loop_thread is not None and _state is not None:
            loop_thread.run_coroutine(self._stop())

    async def _start(self, broker: dramatiq.Broker) -> None:
        global _state
        tracing.configure_tracing(self.settings)
        rt = await Runtime.start(
            self.settings, dispatcher=DramatiqDispatcher(broker, self.settings.queue_name)
        )
        if not self.settings.mcp_allow_private:
            # A workspace's registered MCP server is checked again before each session is opened:
            # its name may resolve to a private address since it was registered (docs/mcp.md).
            rt.mcp.url_guard = partial(check_webhook_url, allow_private=False)
        pool = RunPool(rt)
        pool.start()
        sweeper = asyncio.create_task(
            _background(rt) if self.sweep else asyncio.Event().wait(), name="stevora-sweep"
        )
        # Published before the first message: a definition naming this worker's servers is accepted.
        await mcp_servers.publish(rt, pool.worker_id)
        publisher = asyncio.create_task(mcp_servers.publish_forever(rt, pool.worker_id), name="stevora-mcp")
        _state = WorkerState(rt, pool, sweeper, publisher)
        tune_gc()
        log.info(
            "worker_started", worker_id=pool.worker_id, max_concurrent_runs=self.settings.max_concurrent_runs
        )

    async def _stop(self) -> None:
        global _state
        state, _state = _state, None
        if state is None:
            return
        state.sweeper.cancel()
        await asyncio.gather(state.sweeper, return_exceptions=True)
        await state.run_pool.close()
        await mcp_servers.withdraw(state.runtime, state.run_pool.worker_id, state.mcp_publisher)
        await state.runtime.close()
        tracing.shutdown_tracing()
        log.info("worker_stopped", worker_id=state.run_pool.worker_id)
