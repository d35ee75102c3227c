"""Connections: a process's one asyncpg pool, for the engine's guarded transitions and
checkpoints and for the reads and writes of the API and the UI (`stevora.db.reads`).

Everything runs hand-written SQL on asyncpg because each checkpoint is on the hot path (measured
when the engine was designed: SQLAlchemy Core costs ~1.9x a raw asyncpg round trip;
docs/architecture.md). Tables are still defined once, in stevora.db.models, and only Alembic
changes them.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

import asyncpg
import orjson

# Datetimes go through `default=str` as with the stdlib encoder (orjson would write RFC 3339);
# integer dict keys become strings as json.dumps makes them.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


# An escaped NUL (`\\u0000`) preceded by an even number of backslashes, i.e. not itself escaped.
_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")
# In a Python str a surrogate pair is one code point already: any surrogate left is a lone one.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")


# `storable_text(value)`: `value` as PostgreSQL text and jsonb strings can hold it: NUL and lone
# surrogates (which a model or a tool may produce) replaced by U+FFFD. The regex's own `sub`,
# partially applied: several calls per tool round, no Python frame for each.
storable_text: Callable[[str], str] = functools.partial(_UNSTORABLE_CHARS.sub, "\ufffd")


def _dumps(value: Any) -> str:
    """JSON PostgreSQL accepts, whatever a model or a tool put in a string: jsonb refuses the NUL
    character and text that is not valid UTF-8 (a lone surrogate), so both become U+FFFD. (asyncpg's
    json and jsonb codecs: once per JSON parameter of every checkpoint.)"""
    try:
        data = orjson.dumps(value, default=str, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        # What orjson refuses (integers beyond 64 bits, nesting past 255 levels, lone surrogates)
        # the stdlib encoder still writes.
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
        data = _LONE_SURROGATE.sub("\ufffd", text).encode()
    if b"\\u0000" in data:
        data = _NUL_ESCAPE.sub(rb"\1\\ufffd", data)
    return data.decode()


# The codecs' encoder, for a `json` value sent as text inside a batch's jsonb document
# (stevora.db.group_commit): the same bytes as the value sent as its own parameter.
dumps = _dumps


def _loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        # What orjson cannot read back (a number beyond a double, stored before the input limits of
        # docs/security.md) the stdlib decoder reads exactly: a run holding it stays readable, so it
        # can still be cancelled, failed or shown.
        return json.loads(text)


async def _init_connection(conn: asyncpg.Connection) -> None:
    # orjson: every checkpoint encodes its request/response/payload columns and every transcript
    # rebuild decodes them; ~5x faster than the stdlib codec (docs/benchmarks.md). jsonb's binary
    # wire format measured no better than text, so the columns stay text on the wire.
    await conn.set_type_codec("jsonb", encoder=_dumps, decoder=_loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=_dumps, decoder=_loads, schema="pg_catalog")


def asyncpg_dsn(database_url: str) -> str:
    """`postgresql+asyncpg://...` (SQLAlchemy form) → `postgresql://...` (asyncpg form)."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


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


async def ping(pool: asyncpg.Pool) -> None:
    """One round trip (the health check)."""
    await pool.fetchval("SELECT 1")


async def notify(pool: asyncpg.Pool, channel: str, payload: str) -> None:
    """`pg_notify` outside any transaction: delivered to listeners at once, stored nowhere."""
    await pool.execute("SELECT pg_notify($1, $2)", channel, payload)


async def notify_many(pool: asyncpg.Pool, channel: str, payloads: list[str]) -> None:
    """`notify` for many payloads in one statement, delivered in the list's order. (Distinct
    payloads: PostgreSQL folds identical ones sent in one transaction into one.)"""
    await pool.execute(
        "SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS u(p, i) ORDER BY i",
        channel,
        payloads,
    )
