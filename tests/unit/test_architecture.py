"""The layering of docs/architecture.md and the step-type seam, checked on every test run."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from stevora.definitions.workflow import STEP_TYPES
from stevora.engine.steps.registry import REGISTERED

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_in_pyproject_hold() -> None:
    """`lint-imports` fails on any import that crosses a layer (see [tool.importlinter])."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_step_type_a_definition_accepts_has_an_engine_module() -> None:
    assert set(REGISTERED) == set(STEP_TYPES)
    for name, step_type in REGISTERED.items():
        assert step_type.name == name


_SQL = re.compile(r"\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|WITH)\s")
_STATEMENT_BUILDERS = {"select", "insert", "update", "delete", "func", "text"}


def test_every_sql_statement_lives_in_stevora_db() -> None:
    """Outside `stevora.db` (and the test doubles) no module writes SQL or builds a statement:
    the UI, the API, the engine and the edges read and write through `stevora.db`."""
    offenders = []
    for path in sorted((ROOT / "stevora").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("stevora/db/", "stevora/testing/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr) and node.values:  # an f-string: its leading text
                node = node.values[0]
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.match(node.value):
                offenders.append(f"{relative}:{node.lineno}: {node.value.strip()[:60]}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
                built = _STATEMENT_BUILDERS & {alias.name for alias in node.names}
                if built:
                    offenders.append(f"{relative}:{node.lineno}: imports {sorted(built)} from {node.module}")
    assert not offenders, "\n".join(offenders)
