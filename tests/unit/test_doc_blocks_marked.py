"""Every fenced block of README.md and docs/ either runs (tests/e2e/test_docs_under_make_dev.py,
tests/e2e/test_readme.py) or says why it cannot; JSON blocks parse, and definitions and steps
among them are valid."""

from __future__ import annotations

import json

import pytest

from stevora.definitions import parse_definition
from tests.doc_blocks import ROOT, RUNNABLE, blocks, doc_files

ALL = [block for path in doc_files() for block in blocks(path)]


def test_the_blocks_are_found() -> None:
    assert len(ALL) > 80
    assert {"bash", "json", "python"} <= {b.lang for b in ALL}


@pytest.mark.parametrize("block", ALL, ids=lambda b: b.where)
def test_each_block_runs_or_says_why_not(block: object) -> None:
    from tests.doc_blocks import DocBlock

    assert isinstance(block, DocBlock)
    if block.path == ROOT / "README.md":
        # tests/e2e/test_readme.py runs each of these blocks, or skips it with a reason it checks.
        assert block.kind in ("", "readme"), f"{block.where}: the README's marks are readme-test marks"
        return
    if block.skipped:
        reason = block.mark.split(",", 1)[-1].strip()
        assert len(reason) > 15, f"{block.where}: a skip without a reason: {block.mark!r}"
        return
    if block.run_elsewhere:
        runner = ROOT / block.run_elsewhere
        assert runner.exists(), f"{block.where}: {block.run_elsewhere} does not exist"
        assert block.path.name in runner.read_text(), (
            f"{block.where}: {runner.name} never reads {block.path.name}"
        )
        return
    assert not block.mark, f"{block.where}: unknown mark {block.mark!r}"
    assert block.lang in RUNNABLE, f"{block.where}: a `{block.lang}` block cannot run: mark it skip, with why"
    if block.lang == "json":
        try:
            value = json.loads(block.body)
        except ValueError as exc:
            pytest.fail(f"{block.where}: not JSON ({exc}); fix it or mark it skip, with why")
        if isinstance(value, dict) and {"name", "version", "steps"} <= value.keys():
            parse_definition(value)
        elif isinstance(value, dict) and {"type", "name"} <= value.keys() and "steps" not in value:
            parse_definition({"name": "doc", "version": "1", "steps": [value]})
