"""The fenced blocks of README.md and docs/, with the mark a comment line right above each gives.

A block runs as pasted against `make dev` (tests/e2e/test_docs_under_make_dev.py; the README's
own blocks: tests/e2e/test_readme.py), unless a mark says otherwise:

    <!-- doc-test: skip, <why it cannot run as pasted> -->
    <!-- doc-test: run by tests/e2e/<file>.py -->      (another test runs exactly this block)

What "runs" means by language: `bash` and `console` (`$ ` lines) are run in one shell per file,
in order; `python` is saved to a file and run with the project's Python; `json` is parsed, and a
definition (`name`, `version`, `steps`) or a step (`type`, `name`) is validated as one. Any other
language (`http`, `text`, `promql`, `jsonc`) cannot run and needs a skip mark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"bash", "console", "python", "json"}
# Fences may be indented (a block inside a list item); so may the mark above one.
FENCE = re.compile(
    r"(?:^[ \t]*<!-- (?P<kind>readme|doc)-test: (?P<mark>[^>]*?) -->\n)?^[ \t]*```(?P<lang>\w*)\n(?P<body>.*?)^[ \t]*```",
    re.S | re.M,
)


@dataclass(frozen=True)
class DocBlock:
    path: Path
    line: int
    lang: str
    body: str
    mark: str
    kind: str = ""  # "doc" or "readme": which comment gave the mark

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def skipped(self) -> bool:
        return self.mark.startswith("skip")

    @property
    def run_elsewhere(self) -> str | None:
        found = re.match(r"run by (tests/\S+\.py)", self.mark)
        return found.group(1) if found else None

    @property
    def runs_here(self) -> bool:
        return not self.mark and self.lang in RUNNABLE


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[DocBlock]:
    text = path.read_text()
    return [
        DocBlock(
            path,
            text[: m.start("lang")].count("\n") + 1,
            m["lang"],
            m["body"],
            m["mark"] or "",
            m["kind"] or "",
        )
        for m in FENCE.finditer(text)
    ]
