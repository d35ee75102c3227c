"""Every fenced block of docs/ runs as pasted against `make dev`, or says why it cannot
(tests/doc_blocks.py has the marks; tests/unit/test_doc_blocks_marked.py checks every block has
one or is runnable, and that JSON blocks parse).

The server is the Makefile's `dev` recipe, started in a folder that holds the repository's
`examples/` and `.venv` as a fresh clone after `make dev` would. Each page's blocks then run in
order, as a reader pastes them into one terminal: its bash blocks as one shell session, its Python
blocks each saved to a file and run with the project's Python from that folder. The harness
adjustments a reader never sees, as tests/e2e/test_readme.py makes them: a free port instead of
3000 (`PORT` for the recipe, `STEVORA_URL` and the blocks' `localhost:3000` rewritten for the
commands), and for docs/api/ pages `STEVORA_API_KEY` exported as docs/api/README.md's first
block does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, DocBlock, blocks, doc_files
from tests.e2e.test_cli_processes import _free_port, _tail
from tests.e2e.test_examples_under_make_dev import _wait_healthy, fresh_clone, make_dev_env, start_make_dev

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BIN = Path(sys.executable).parent
BLOCK_TIMEOUT_S = 240
PAGES = [
    p for p in doc_files() if p.parent != ROOT and any(b.runs_here and b.lang != "json" for b in blocks(p))
]


def _at_port(text: str, port: int) -> str:
    return re.sub(r"(localhost|127\.0\.0\.1):3000", rf"\g<1>:{port}", text)


def _run(command: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{output[-4000:]}"
    return output


def _page(page: Path, clone: Path, env: dict[str, str], port: int) -> list[str]:
    runnable = [b for b in blocks(page) if b.runs_here and b.lang in ("bash", "console", "python")]
    shell: list[DocBlock] = [b for b in runnable if b.lang in ("bash", "console")]
    ran = []
    if shell:
        script = ["set -euo pipefail"]
        for block in shell:
            body = (
                block.body
                if block.lang == "bash"
                else "\n".join(line[2:] for line in block.body.splitlines() if line.startswith("$ "))
            )
            script += [f"echo '### {block.where}' >&2", _at_port(body, port)]
        _run(["bash", "-c", "\n".join(script)], clone, env, f"the bash blocks of {page.name}")
        ran += [b.where for b in shell]
    for block in (b for b in runnable if b.lang == "python"):
        snippet = clone / f"snippet_{block.line}.py"
        snippet.write_text(_at_port(block.body, port))
        _run([str(BIN / "python"), snippet.name], clone, env, block.where)
        ran.append(block.where)
    return ran


def test_every_runnable_docs_block_runs_under_make_dev(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    port = _free_port()
    env = make_dev_env()
    dev_log = tmp_path / "dev.log"
    dev = start_make_dev(clone, env, port, dev_log)
    ran: list[str] = []
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", dev, dev_log)
        commands_env = {**env, "STEVORA_URL": f"http://127.0.0.1:{port}"}
        key = (clone / ".stevora" / "dev-api-key").read_text().strip()
        for page in PAGES:
            page_env = {**commands_env, "STEVORA_API_KEY": key} if page.parent.name == "api" else commands_env
            try:
                ran += _page(page, clone, page_env, port)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- make dev:\n{_tail(dev_log)}") from None
    finally:
        dev.terminate()
        try:
            dev.wait(timeout=30)
        except subprocess.TimeoutExpired:
            dev.kill()
    expected = [b.where for p in PAGES for b in blocks(p) if b.runs_here and b.lang != "json"]
    assert sorted(ran) == sorted(expected)
    assert any("time-travel.md" in w for w in ran) and any("client.md" in w for w in ran)
