"""One way to read (docs/architecture.md): one asyncpg pool per process, the reads of
`stevora.db.reads` returning typed rows, and the driver's records kept inside `stevora.db`.
(The import contract "only the table models use SQLAlchemy" in pyproject.toml pins the rest.)"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import asyncpg

from stevora.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]


def _modules_outside_db() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted((ROOT / "stevora").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("stevora/db/", "stevora/migrations/")):
            continue
        found.append((relative, ast.parse(path.read_text())))
    return found


def test_no_module_outside_stevora_db_names_the_drivers_record() -> None:
    """`asyncpg.Record` (an import of it, an annotation, any use) stops at `stevora.db`: the API,
    the UI, the CLI and the engine take typed rows or `DbRow`."""
    offenders = []
    for relative, tree in _modules_outside_db():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "Record":
                if isinstance(node.value, ast.Name) and node.value.id == "asyncpg":
                    offenders.append(f"{relative}:{node.lineno}: asyncpg.Record")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asyncpg"):
                if any(alias.name == "Record" for alias in node.names):
                    offenders.append(f"{relative}:{node.lineno}: from {node.module} import Record")
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "asyncpg.Record" in node.value
            ):
                offenders.append(f"{relative}:{node.lineno}: 'asyncpg.Record' in a string annotation")
    assert not offenders, "\n".join(offenders)


def test_no_module_outside_stevora_db_opens_a_sqlalchemy_connection() -> None:
    """No second connection path: nothing in the package imports SQLAlchemy's asyncio engine."""
    offenders = []
    for path in sorted((ROOT / "stevora").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("stevora/migrations/"):
            continue  # Alembic's env.py migrates with its own engine, outside any process's runtime
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            offenders += [
                f"{relative}:{node.lineno}: {n}" for n in names if n.startswith("sqlalchemy.ext.asyncio")
            ]
    assert not offenders, "\n".join(offenders)


def test_the_runtime_holds_one_pool_and_no_sqlalchemy_engine() -> None:
    hints = typing.get_type_hints(Runtime)
    pools = [f.name for f in dataclasses.fields(Runtime) if hints[f.name] is asyncpg.Pool]
    assert pools == ["pool"]
    assert not [name for name, hint in hints.items() if "sqlalchemy" in getattr(hint, "__module__", "")]
    assert not hasattr(Runtime, "sessions") and not hasattr(Runtime, "engine")
