"""A non-editable install migrates and runs the demo: the wheel ships the Alembic scripts and the
demo's workflows and tools, and neither command needs the repository.

The wheel is built from this checkout's files (tracked and new, not ignored; links kept as links)
in a temporary folder and installed into a fresh virtualenv; pip resolves the dependencies from
its configured indexes and cache. Both commands run from an unrelated directory.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import _admin, _with_database

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def _sh(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (
        f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    return done.stdout + done.stderr


def _copy_checkout(target: Path) -> None:
    for name in _sh("git", "ls-files", "-co", "--exclude-standard", cwd=ROOT).splitlines():
        source, copy = ROOT / name, target / name
        if not source.is_symlink() and not source.is_file():
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            copy.symlink_to(os.readlink(source))
        else:
            copy.write_bytes(source.read_bytes())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, a fresh virtualenv with `pip install "<wheel>[server]"`)."""
    base = tmp_path_factory.mktemp("wheel-install")
    _copy_checkout(base / "src")
    _sh(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", base / "dist", base / "src")
    wheel = next((base / "dist").glob("stevora-*.whl"))
    venv = base / "venv"
    _sh(sys.executable, "-m", "venv", venv)
    _sh(venv / "bin" / "pip", "install", "--quiet", f"{wheel}[server]")  # the server extra: migrate, demo
    return wheel, venv


def test_the_wheel_ships_migrations_and_the_demo_examples(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    for expected in (
        "stevora/migrations/env.py",
        "stevora/migrations/script.py.mako",
        "stevora/examples/lead-onboarding.json",
        "stevora/examples/research-agent.json",
        "stevora/examples/tools.py",
    ):
        assert expected in names, expected
    assert any(n.startswith("stevora/migrations/versions/") and n.endswith(".py") for n in names)


def test_installed_stevora_migrates_and_runs_the_demo_from_another_directory(
    installed: tuple[Path, Path], database_url: str, tmp_path: Path
) -> None:
    _, venv = installed
    fresh = f"stevora_wheel_{secrets.token_hex(4)}"
    asyncio.run(_admin(database_url, f'CREATE DATABASE "{fresh}"'))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEVORA_", "PYTHON", "VIRTUAL_ENV"))}
    env |= {"STEVORA_DATA_DIR": str(tmp_path / "data"), "STEVORA_LOG_FORMAT": "json"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    try:
        fresh_url = _with_database(database_url, fresh)
        out = _sh(venv / "bin" / "stevora", "migrate", "--database-url", fresh_url, cwd=elsewhere, env=env)
        assert "database is up to date" in out
        tables = asyncio.run(_tables(fresh_url))
        assert {"workflow_runs", "workflow_events", "tool_trace", "alembic_version"} <= tables

        demo = _sh(venv / "bin" / "stevora", "demo", cwd=elsewhere, env=env)
        assert demo.count("status COMPLETED") == 2, demo[-3000:]
        assert "TOOL_CALL_COMPLETED" in demo
    finally:
        asyncio.run(_admin(database_url, f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)'))


async def _tables(url: str) -> set[str]:
    import asyncpg

    from stevora.db.database import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    return {r["tablename"] for r in rows}
