"""Small helpers running SQLAlchemy Core statements on the runtime's engine.

The API reads and writes through SQLAlchemy Core over the table models (one definition of the
schema); rows come back as mappings with snake_case keys that the response schemas accept.
Run mutations are not here: they go through `stevora.engine.commands`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Executable, FromClause, RowMapping, func, select

from stevora.runtime import Runtime


async def fetch_one(rt: Runtime, stmt: Executable) -> RowMapping | None:
    async with rt.engine.connect() as conn:
        return (await conn.execute(stmt)).mappings().first()


async def fetch_all(rt: Runtime, stmt: Executable) -> Sequence[RowMapping]:
    async with rt.engine.connect() as conn:
        return (await conn.execute(stmt)).mappings().all()


async def fetch_value(rt: Runtime, stmt: Executable) -> Any:
    async with rt.engine.connect() as conn:
        return (await conn.execute(stmt)).scalar()


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
    total = await fetch_value(rt, select(func.count()).select_from(source).where(*where)) or 0
    if offset >= total:
        return [], total
    stmt = select(*(columns or [source])).where(*where).order_by(*order_by).offset(offset).limit(limit)
    return list(await fetch_all(rt, stmt)), total
