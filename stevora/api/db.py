"""Small helpers running SQLAlchemy Core statements on the runtime's engine.

The API reads and writes through SQLAlchemy Core over the table models (one definition of the
schema), with the statements built in `stevora.db.resources`; rows come back as mappings with
snake_case keys that the response schemas accept. Run mutations are not here: they go through
`stevora.engine.commands` and the answers in `stevora.engine.steps`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Executable, FromClause, RowMapping
from sqlalchemy.engine import Result

from stevora.db.database import is_connection_error
from stevora.db.resources import page_statements
from stevora.runtime import Runtime

T = TypeVar("T")


async def read_retrying(read: Callable[[], Awaitable[T]]) -> T:
    """Run a read; once more if the connection broke under it (reads are safe to repeat, and the
    pool has replaced the dead connection by then). A second failure goes to the 503 handler."""
    try:
        return await read()
    except Exception as exc:
        if not is_connection_error(exc):
            raise
    return await read()


async def _read(rt: Runtime, stmt: Executable, take: Callable[[Result[Any]], T]) -> T:
    async def once() -> T:
        async with rt.engine.connect() as conn:
            return take(await conn.execute(stmt))

    return await read_retrying(once)


async def fetch_one(rt: Runtime, stmt: Executable) -> RowMapping | None:
    return await _read(rt, stmt, lambda r: r.mappings().first())


async def fetch_all(rt: Runtime, stmt: Executable) -> Sequence[RowMapping]:
    return await _read(rt, stmt, lambda r: r.mappings().all())


async def fetch_value(rt: Runtime, stmt: Executable) -> Any:
    return await _read(rt, stmt, lambda r: r.scalar())


async def write_one(rt: Runtime, stmt: Executable) -> RowMapping | None:
    """Run a writing statement (with RETURNING) in its own transaction; the first row or None."""
    async with rt.engine.begin() as conn:
        return (await conn.execute(stmt)).mappings().first()


async def fetch_page(
    rt: Runtime,
    source: FromClause | Any,
    where: Sequence[Any],
    order_by: Sequence[Any],
    offset: int,
    limit: int,
    columns: Sequence[Any] | None = None,
) -> tuple[list[RowMapping], int]:
    """One page of `source` rows matching `where` in `order_by` order, and the total count.

    The page query is skipped when the offset is past the end."""
    count, rows = page_statements(source, where, order_by, offset, limit, columns)
    total = await fetch_value(rt, count) or 0
    if offset >= total:
        return [], total
    return list(await fetch_all(rt, rows)), total
