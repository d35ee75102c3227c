"""Alembic environment (async). The database URL comes from the caller or STEVORA_DATABASE_URL."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from stevora.db import trigger_tables  # noqa: F401  (the trigger tables share the metadata)
from stevora.db.models import Base
from stevora.settings import Settings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.attributes.get("database_url") or Settings().database_url


def _run(connection: Connection) -> None:
    # Serialise concurrent `stevora migrate` runs (several containers starting at once).
    # The lock is session-level, so it outlives the commits below.
    connection.exec_driver_sql("SELECT pg_advisory_lock(7472261)")
    connection.commit()
    try:
        context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    finally:
        connection.exec_driver_sql("SELECT pg_advisory_unlock(7472261)")
        connection.commit()


async def _run_async() -> None:
    engine = create_async_engine(_url())
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
    else:
        asyncio.run(_run_async())


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
