"""Run Alembic programmatically (`stevora migrate`, `stevora dev`, the test session).

The configuration is built here, not read from `alembic.ini`: the scripts ship inside the package
(`stevora/migrations`, a link to the repository's `migrations/` folder in a checkout, real files
in a wheel), so an installed Stevora migrates from any directory. `alembic` run from the
repository root still works through `alembic.ini`.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

SCRIPT_LOCATION = Path(__file__).resolve().parents[1] / "migrations"


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    cfg.attributes["database_url"] = database_url
    return cfg


def upgrade_head(database_url: str) -> None:
    """Bring the schema to the newest revision. Safe to run concurrently from several processes."""
    command.upgrade(alembic_config(database_url), "head")
