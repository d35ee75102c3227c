"""Which database errors the API answers with 503 (retry shortly) rather than 500."""

from __future__ import annotations

import asyncpg
import pytest

from stevora.db.transient import is_connection_error


@pytest.mark.parametrize(
    "exc",
    [
        # A pooled connection the server terminated while idle, handed to a request before asyncpg
        # saw the EOF (the chaos suite's PostgreSQL restart got a 500 from POST /v1/workflow-runs).
        asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        ConnectionRefusedError(111, "Connection refused"),
    ],
)
def test_lost_connections_are_unavailable(exc: BaseException) -> None:
    assert is_connection_error(exc)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.InternalClientError("cannot switch to state 12; another operation (5) is in progress"),
        asyncpg.UniqueViolationError("duplicate key"),
        ValueError("a bug"),
    ],
)
def test_other_errors_are_not(exc: BaseException) -> None:
    assert not is_connection_error(exc)
