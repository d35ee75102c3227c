"""Run Alembic programmatically (`stevora migrate`, `stevora dev`, the test session)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

ROOT = Path(__file__).resolve().parents[2]


def alembic_config(database_url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["database_url"] = database_url
    return cfg


def upgrade_head(database_url: str) -> None:
    """Bring the schema to the newest revision. Safe to run concurrently from several processes."""
    command.upgrade(alembic_config(database_url), "head")


async def upgrade_head_async(database_url: str) -> None:
    await asyncio.to_thread(upgrade_head, database_url)
