"""The pause and resume reasons the engine writes are exactly the ones docs/state-machines.md lists."""

from __future__ import annotations

import re
from pathlib import Path

from stevora.statuses import PauseReason, ResumeReason

DOC = Path(__file__).resolve().parents[2] / "docs" / "state-machines.md"


def _documented(event_type: str) -> set[str]:
    row = next(line for line in DOC.read_text().splitlines() if line.startswith(f"| `{event_type}` |"))
    listed = re.search(r"`reason` \(([^)]*)\)", row)
    assert listed is not None, row
    return set(re.findall(r"`([a-z_]+)`", listed.group(1)))


def test_pause_reasons_are_the_documented_ones() -> None:
    assert _documented("WORKFLOW_PAUSED") == set(PauseReason)


def test_resume_reasons_are_the_documented_ones() -> None:
    assert _documented("WORKFLOW_RESUMED") == set(ResumeReason)
