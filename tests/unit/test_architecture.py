"""The layering of docs/architecture.md and the step-type seam, checked on every test run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stevora.definitions.workflow import STEP_TYPES as DEFINITION_STEP_TYPES
from stevora.engine.steps.registry import STEP_TYPES

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
    assert set(STEP_TYPES) == set(DEFINITION_STEP_TYPES)
    for name, step_type in STEP_TYPES.items():
        assert step_type.name == name
