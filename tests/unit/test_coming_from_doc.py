"""docs/tool-calling.md's "Coming from llm / Stewrd / Dagu / an agent-flow platform" tables name
the test that verifies each row: every named test must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = {
    "api/": "tests/integration/api/",
    "cli/": "tests/integration/cli/",
    "client/": "tests/integration/client/",
    "loop/": "tests/integration/loop/",
}


def section() -> str:
    doc = (ROOT / "docs" / "tool-calling.md").read_text()
    start = doc.index("## Coming from llm / Stewrd / Dagu / an agent-flow platform")
    return doc[start : doc.index("\n## ", start + 1)]


def test_every_test_the_section_names_exists() -> None:
    named = 0
    for cell in re.findall(r"\| ([^|]*::[^|]*) \|\n", section()):
        path: str | None = None
        for ref in re.findall(r"`([^`]+)`", cell):
            file, _, name = ref.partition("::")
            if file:
                path = next(
                    (full + file[len(short) :] for short, full in PREFIXES.items() if file.startswith(short)),
                    file,
                )
            assert path is not None, ref
            source = (ROOT / path).read_text()
            assert re.search(rf"def {re.escape(name)}\(", source), f"{path}::{name} is not a test"
            named += 1
    assert named >= 25
