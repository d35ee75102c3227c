"""Connections: a raw asyncpg pool for the engine's guarded transitions and checkpoints, and a
SQLAlchemy async engine for the API's queries.

The engine writes with hand-written SQL on asyncpg because each checkpoint is on the hot path
(DESIGN §7: SQLAlchemy Core costs ~1.9x a raw asyncpg round trip). Tables are still defined once,
in stevora.db.models, and only Alembic changes them.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

# Datetimes go through `default=str` as with the stdlib encoder (orjson would write RFC 3339);
# integer dict keys become strings as json.dumps makes them.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


def _encode(value: Any) -> bytes:
    try:
        return orjson.dumps(value, default=str, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        # What orjson refuses (integers beyond 64 bits, ...) the stdlib encoder still writes.
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def _dumps(value: Any) -> str:
    return _encode(value).decode()


async def _init_connection(conn: asyncpg.Connection) -> None:
    # orjson: every checkpoint encodes its request/response/payload columns and every transcript
    # rebuild decodes them; ~5x faster than the stdlib codec (docs/benchmarks.md). jsonb's binary
    # wire format measured no better than text, so the columns stay text on the wire.
    await conn.set_type_codec("jsonb", encoder=_dumps, decoder=orjson.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=_dumps, decoder=orjson.loads, schema="pg_catalog")


def asyncpg_dsn(database_url: str) -> str:
    """`postgresql+asyncpg://...` (SQLAlchemy form) → `postgresql://...` (asyncpg form)."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


def sqlalchemy_url(database_url: str) -> str:
    if database_url.startswith("postgresql://"):
        return database_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    return database_url


async def _no_reset(conn: asyncpg.Connection) -> None:
    """asyncpg's default reset costs a round trip per release (`RESET ALL; UNLISTEN *; ...`),
    which would double every checkpoint. This pool never changes session state (no SET, LISTEN,
    advisory locks or cursors), so there is nothing to reset."""


async def create_pool(database_url: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        asyncpg_dsn(database_url),
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        reset=_no_reset,
        # Statements are few and fixed; caching their plans is the point of the raw pool.
        statement_cache_size=256,
    )
    assert pool is not None
    return pool


def create_engine(database_url: str, *, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(
        sqlalchemy_url(database_url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=False,
        json_serializer=_dumps,
    )


def session_factory(engine: AsyncEngine) -> async_sessionmaker[Any]:
    return async_sessionmaker(engine, expire_on_commit=False)
