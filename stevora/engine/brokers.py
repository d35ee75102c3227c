"""Dramatiq brokers from a URL, with the middleware the engine needs set deliberately.

* `amqp://...` → RabbitMQ (the default), `redis://...` → Redis, `stub://` → in-process StubBroker
  (`stevora dev` and tests).
* `AsyncIO` middleware: actors are `async def` and share one event loop thread per process, the
  loop the runtime (asyncpg pools, run tasks) lives on.
* `Retries`: infrastructure failures only (e.g. the database restarting during a claim); step
  retries are the engine's, durable and visible as events. A few quick retries, not 20 over 7 days.
* `TimeLimit`: actors return as soon as a run is claimed (the run then executes as a task), so a
  minute is generous; the default 10 minutes would hide a stuck claim.
"""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import (
    AgeLimit,
    AsyncIO,
    Callbacks,
    Pipelines,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

ACTOR_TIME_LIMIT_MS = 60_000


def _middleware() -> list[dramatiq.Middleware]:
    return [
        AgeLimit(),
        TimeLimit(time_limit=ACTOR_TIME_LIMIT_MS),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(max_retries=5, min_backoff=500, max_backoff=10_000),
        AsyncIO(),
    ]


# In-process brokers are shared by URL so the API and the in-process worker of `stevora dev`
# (two runtimes on two event loops in one process) talk through the same queue.
_stub_brokers: dict[str, StubBroker] = {}


def build_broker(url: str) -> dramatiq.Broker:
    if url.startswith("stub://"):
        if url not in _stub_brokers:
            _stub_brokers[url] = StubBroker(middleware=_middleware())
        return _stub_brokers[url]
    if url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url, middleware=_middleware())
    if url.startswith(("redis://", "rediss://", "unix://")):
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=url, middleware=_middleware())  # type: ignore[no-untyped-call]
    raise ValueError(f"unsupported broker URL {url!r}: use amqp://, redis:// or stub://")
