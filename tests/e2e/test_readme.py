"""The README as a new user follows it: every command block, in order, in a fresh clone.

The clone is `git clone` of this checkout's HEAD into a temporary folder; `make demo` builds its
own `.venv` there (pip reuses the machine's cache, so no network beyond the package index).
Blocks are run as written, with three harness adjustments a reader never sees:
* `make dev` gets a free port through the Makefile's `PORT` (the README's 3000 may be taken here);
  the `stevora` commands get the same through `STEVORA_URL`, and the Python snippet's
  `http://127.0.0.1:3000` is rewritten to it;
* a `<!-- readme-test: background ... -->` block is started and left running until the end;
* a `<!-- readme-test: skip, <why> -->` block is not run (the test suite itself, production setup).
Every other block runs: bash blocks as scripts, `$ ` lines of console blocks one by one, the
`# path.py` Python block written to that path and imported, the other Python block saved as
`quickstart.py` (as the README says) and run, the JSON block parsed as a definition.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stevora.definitions import parse_definition

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)
SETUP_TIMEOUT_S = 900  # `make demo` from nothing: venv, install (cached wheels), PostgreSQL, two runs
COMMAND_TIMEOUT_S = 180


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    mark: str

    @property
    def skipped(self) -> bool:
        return self.mark.startswith("skip")

    @property
    def background(self) -> bool:
        return self.mark.startswith("background")


def readme_blocks(text: str) -> list[Block]:
    return [Block(m["lang"], m["body"], m["mark"] or "") for m in FENCE.finditer(text)]


def test_readme_blocks_are_found_and_every_skip_says_why() -> None:
    blocks = readme_blocks(README.read_text())
    assert [b.lang for b in blocks][:2] == ["bash", "bash"] and "make demo" in blocks[0].body
    assert {"bash", "json", "python", "console"} <= {b.lang for b in blocks}
    for block in blocks:
        if block.skipped:
            assert len(block.mark.split(",", 1)[-1].strip()) > 10, f"a skip without a reason: {block}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(port: int) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STEVORA_", "OPENAI_", "ANTHROPIC_", "VIRTUAL_ENV"))
    }
    keep.pop("PYTHONPATH", None)
    return {
        **keep,
        "PORT": str(port),
        "STEVORA_URL": f"http://127.0.0.1:{port}",
        "STEVORA_LOG_LEVEL": "WARNING",
    }


def _run(script: str, cwd: Path, env: dict[str, str], timeout_s: float) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"`{script.strip()}` exited {done.returncode}:\n{output[-4000:]}"
    return output


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    target = tmp_path / "stevora"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True)
    subprocess.run(["git", "checkout", "--quiet", head.stdout.strip()], cwd=target, check=True)
    return target


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in its terminal: the whole `make` group
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _start_background(block: Block, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    wait_for = re.search(r'waits for "([^"]+)"', block.mark)
    assert wait_for, block.mark
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", block.body], cwd=cwd, env=env, stdout=out,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while wait_for.group(1) not in log.read_text():
        assert proc.poll() is None, (
            f"`{block.body.strip()}` exited {proc.returncode}:\n{log.read_text()[-4000:]}"
        )
        assert time.monotonic() < deadline, f"`{block.body.strip()}` never printed {wait_for.group(1)!r}"
        time.sleep(0.5)
    return proc


def test_every_readme_command_works_as_pasted_in_a_fresh_clone(
    clone: Path, background: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    port = _free_port()
    env = _env(port)
    blocks = readme_blocks((clone / "README.md").read_text())
    ran: list[str] = []
    for index, block in enumerate(blocks):
        if block.skipped:
            continue
        if block.background:
            background.append(_start_background(block, clone, env, tmp_path / f"background-{index}.log"))
            ran.append(block.body.strip())
        elif block.lang == "bash":
            output = _run(block.body, clone, env, SETUP_TIMEOUT_S)
            if "make demo" in block.body:
                assert "The demo's server has stopped" in output and "make dev" in output, output[-3000:]
                assert ".venv/bin/stevora" in output  # where the command is, for the next blocks
            ran.append(block.body.strip())
        elif block.lang == "json":
            parse_definition(json.loads(block.body))
        elif block.lang == "console":
            for line in block.body.splitlines():
                if line.startswith("$ "):
                    output = _run(line[2:], clone, env, COMMAND_TIMEOUT_S)
                    if " run " in line and "--watch" in line:
                        assert "COMPLETED in" in output and "scripted (offline)" in output, output
                    ran.append(line[2:])
        elif block.lang == "python" and block.body.startswith("# "):
            module = block.body.splitlines()[0][2:].strip()
            (clone / module).parent.mkdir(parents=True, exist_ok=True)
            (clone / module).write_text(block.body)
            name = module.removesuffix(".py").replace("/", ".")
            _run(f".venv/bin/python -c 'import {name}'", clone, env, COMMAND_TIMEOUT_S)
            ran.append(f"import {name}")
        elif block.lang == "python":
            (clone / "quickstart.py").write_text(
                block.body.replace("http://127.0.0.1:3000", env["STEVORA_URL"])
            )
            output = _run(".venv/bin/python quickstart.py", clone, env, COMMAND_TIMEOUT_S)
            assert output.startswith("COMPLETED "), output
            assert "search_knowledge_base" in output and "get_customer_data" in output, output
            ran.append("python quickstart.py")
    assert ran[0].startswith("make demo") and "make dev" in ran and "python quickstart.py" in ran, ran
