"""The hostile-model suite's figures, printed at the end of the pytest session (docs/testing.md)."""

from __future__ import annotations

from typing import Any

from tests.e2e.hostile.stats import STATS


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if STATS.runs:
        terminalreporter.section("hostile-model suite")
        for line in STATS.lines():
            terminalreporter.write_line(line)
