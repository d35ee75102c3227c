"""Database errors that mean "the connection or the server went away", and retrying through them.

A PostgreSQL restart, `pg_terminate_backend` or a failover surfaces as one of a handful of
asyncpg errors. None of them says anything about the statement: the engine retries the
transition with backoff instead of failing a step or dropping a run, and gives up (leaving the
run to the recovery sweep) only after a bounded budget.

One asyncpg quirk belongs here too. When the server terminates an *idle* pooled connection it
sends a FATAL ErrorResponse before closing the socket. asyncpg's protocol is idle, cannot place
the message and moves to its error-consuming state (2); the socket's EOF is only seen on a later
turn of the event loop. A task that acquires that connection in between gets
`InternalClientError: cannot switch to state N; another operation (2) is in progress` — the
connection is dead, not shared. It is retried like any other lost connection.

Two more errors are retried the same way: a deadlock and a serialization failure. PostgreSQL
rolled the transaction back and says to run it again; they say nothing about the statement
either. Failing the pass instead would hand the run back with a completed handler's outcome
unrecorded, and the handler would run again on redispatch (the chaos suite saw three executions
of one task: a child run's ending deadlocked twice while telling its parent).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import structlog

log = structlog.get_logger("stevora.db")

T = TypeVar("T")

# Exponential backoff between attempts: 50 ms, 100 ms, ... capped at 2 s, each scaled by a
# random factor in [0.5, 1] so that a fleet of workers does not reconnect in lockstep.
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0
# How long one operation keeps retrying before it gives up (then the run goes to the sweep).
RETRY_BUDGET_S = 20.0

DEAD_CONNECTION_MARKERS = (
    "another operation (2)",
    "protocol is in an unexpected state",
    "connection is closed",
    "connection was closed",
    "unexpected connection_lost",
)


# 40P01 and 40001: PostgreSQL rolled the transaction back and asks for it to be run again.
_ROLLED_BACK = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
# The server went away, is shutting down or starting up, or refuses more connections.
_UNAVAILABLE = (
    asyncpg.PostgresConnectionError  # class 08: ConnectionDoesNotExist, ConnectionFailure, ...
    | asyncpg.AdminShutdownError
    | asyncpg.CrashShutdownError
    | asyncpg.CannotConnectNowError
    | asyncpg.TooManyConnectionsError
    | OSError  # connection refused or reset while the server restarts, a connect timeout
)


def _lost_connection(exc: BaseException) -> bool:
    if isinstance(exc, _UNAVAILABLE):
        return True
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError):
        return any(marker in str(exc) for marker in DEAD_CONNECTION_MARKERS)
    return False


def is_transient(exc: BaseException) -> bool:
    """True for errors that mean the database connection was lost, the server is unavailable, or
    PostgreSQL rolled the transaction back asking for it to be run again."""
    return _lost_connection(exc) or isinstance(exc, _ROLLED_BACK)


def is_connection_error(exc: BaseException) -> bool:
    """True when `exc`, or an error it was raised from, means the database is unreachable,
    restarting or dropped the connection: the request may succeed if retried, so the API answers
    503, not 500 (after `retry_transient` gave up)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # A missing file or a refused permission is no database outage, though an OSError.
        if _lost_connection(current) and not isinstance(current, FileNotFoundError | PermissionError):
            return True
        current = current.__cause__ or current.__context__
    return False


def backoff_s(attempt: int) -> float:
    """The pause before retry number `attempt` (1-based)."""
    return float(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0))


class Retrier:
    """Counts consecutive transient failures of one operation and sleeps the backoff between them."""

    def __init__(self, what: str, *, budget_s: float = RETRY_BUDGET_S, **context: object) -> None:
        self.what = what
        self.budget_s = budget_s
        self.context = context
        self.failures = 0
        # True once a failed try may have committed (the connection died mid-statement): a retry
        # that then finds its own rows must read them as written. A deadlock or serialization
        # failure was rolled back for certain, so it does not set this.
        self.outcome_unknown = False
        self._first_failure: float | None = None

    def reset(self) -> None:
        self.failures = 0
        self.outcome_unknown = False
        self._first_failure = None

    async def pause(self, exc: BaseException) -> None:
        """Sleep before the next attempt, or re-raise `exc` when it is not transient or the budget
        is spent."""
        if not is_transient(exc):
            raise exc
        now = time.monotonic()
        if self._first_failure is None:
            self._first_failure = now
        self.failures += 1
        if not isinstance(exc, _ROLLED_BACK):
            self.outcome_unknown = True
        if now - self._first_failure >= self.budget_s:
            log.warning("db_retry_exhausted", operation=self.what, attempts=self.failures, **self.context)
            raise exc
        delay = backoff_s(self.failures)
        log.warning(
            "db_error_retrying",
            operation=self.what,
            attempt=self.failures,
            delay_ms=round(delay * 1000),
            error=f"{type(exc).__name__}: {exc}",
            **self.context,
        )
        await asyncio.sleep(delay)


async def retry_transient(
    fn: Callable[[], Awaitable[T]], what: str, *, budget_s: float = RETRY_BUDGET_S, **context: object
) -> T:
    """`await fn()`, retried with backoff while it fails with a transient database error.

    Only for operations that are safe to repeat (reads, idempotent updates)."""
    retrier = Retrier(what, budget_s=budget_s, **context)
    while True:
        try:
            return await fn()
        except Exception as exc:
            await retrier.pause(exc)
