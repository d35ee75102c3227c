"""`stevora worker`: one or more worker processes consuming the run queue."""

from __future__ import annotations

import multiprocessing
import signal
import threading

import dramatiq
import structlog

from stevora.engine.brokers import build_broker
from stevora.logging import configure_logging
from stevora.observability import metrics
from stevora.observability.logs import redact_url
from stevora.settings import Settings
from stevora.tuning import use_uvloop
from workers.actors import declare_actors
from workers.edge import StevoraWorkerMiddleware, load_tool_modules

log = structlog.get_logger("stevora.worker")


def build_worker(
    settings: Settings, *, threads: int, sweep: bool = True
) -> tuple[dramatiq.Broker, dramatiq.Worker]:
    """A started-able Dramatiq worker whose actors drive runs through this process's runtime."""
    load_tool_modules(settings.tool_modules)
    broker = build_broker(settings.broker_url)
    broker.add_middleware(StevoraWorkerMiddleware(settings, sweep=sweep))
    declare_actors(broker, settings.queue_name)
    return broker, dramatiq.Worker(broker, worker_threads=threads, worker_timeout=200)


def run_worker_process(settings: Settings, threads: int, serve_metrics: bool = False) -> None:
    configure_logging(settings)
    use_uvloop()  # before build_worker: the AsyncIO middleware creates its loop from the policy
    broker, worker = build_worker(settings, threads=threads)
    if serve_metrics:
        metrics.serve_worker_metrics(settings.host, settings.metrics_port, settings.metrics_token)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    worker.start()
    log.info(
        "worker_ready",
        broker=redact_url(settings.broker_url),
        queue=settings.queue_name,
        threads=threads,
        metrics=f"http://{settings.host}:{settings.metrics_port}/metrics" if settings.metrics_port else None,
    )
    stop.wait()
    log.info("worker_stopping")
    worker.stop()
    broker.close()


def run(settings: Settings, *, processes: int = 1, threads: int = 8) -> int:
    if processes <= 1:
        run_worker_process(settings, threads, serve_metrics=True)
        return 0
    # The children write their metrics to a shared directory; this process serves their sum.
    metrics.prepare_worker_processes(processes)
    metrics.serve_worker_metrics(settings.host, settings.metrics_port, settings.metrics_token)
    ctx = multiprocessing.get_context("spawn")
    children = [
        ctx.Process(target=run_worker_process, args=(settings, threads), daemon=False)
        for _ in range(processes)
    ]
    for child in children:
        child.start()

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.is_alive():
                child.terminate()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for child in children:
        child.join()
        metrics.process_exited(child.pid)
    return max((c.exitcode or 0) for c in children)
