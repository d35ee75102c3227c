"""Every example docs/tool-calling.md lists runs under `make dev` as documented.

The server is started with the Makefile's own `dev` recipe (its `stevora dev ...` arguments, read
from the Makefile), in a folder holding the repository's `examples/`, with `.stevora` as its data
folder, as in a fresh clone. The documentation's command block then runs as one bash script, as
written: the only harness adjustments are a free port (`PORT` for the recipe, `STEVORA_URL` for
the commands, as tests/e2e/test_readme.py does) and `.venv` linked into the folder, as `make dev`
leaves it in a clone (the block activates it; `stevora` is not on PATH before that). Where the
block says to approve from another terminal with the command `--watch` prints, the test runs that
command.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.test_cli_processes import _free_port, _tail

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tool-calling.md"
BIN = Path(sys.executable).parent
APPROVE = re.compile(r"stevora approve (apr_[0-9a-z]+)")


def _make_dev_args(port: int) -> list[str]:
    """The arguments `make dev` passes to `stevora`, read from the Makefile's recipe."""
    recipe = re.search(r"^dev:.*\n\t\$\(BIN\)/stevora (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "the Makefile has no `dev` recipe running $(BIN)/stevora"
    return shlex.split(recipe.group(1).replace("$(PORT)", str(port)))


def _documented_block() -> str:
    text = DOC.read_text()
    start = text.index("Every example runs offline")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert block, "docs/tool-calling.md: no command block after 'Every example runs offline'"
    return block.group(1)


def _table_examples() -> set[str]:
    """The definition files the "Runnable example" column of the table at the top names."""
    table = DOC.read_text().split("## Declaring tools")[0]
    return set(re.findall(r"examples/[\w-]+\.json", table)) | set(re.findall(r"`([\w-]+\.json)`", table))


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"make dev exited early:\n{_tail(log)}"
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never became healthy:\n{_tail(log)}")


def fresh_clone(tmp_path: Path) -> Path:
    """A folder as a clone is after `make dev`: the repository's `examples/` and its `.venv`."""
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "examples").symlink_to(ROOT / "examples")
    (clone / ".venv").symlink_to(BIN.parent)  # blocks start with `source .venv/bin/activate`
    return clone


def make_dev_env() -> dict[str, str]:
    """This process's environment without Stevora's or a provider's settings, nor a venv: PATH as
    a new shell has it, so a block must activate `.venv` to call `stevora`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEVORA_", "OPENAI_", "ANTHROPIC_"))}
    for name in ("VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(name, None)
    env["STEVORA_LOG_LEVEL"] = "WARNING"
    return env


def start_make_dev(clone: Path, env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """The Makefile's `dev` recipe in `clone` on `port`, its output in `log`."""
    with log.open("wb") as sink:
        return subprocess.Popen(
            [str(BIN / "stevora"), *_make_dev_args(port)],
            cwd=clone,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def test_the_block_runs_every_example_definition_the_table_lists() -> None:
    block = _documented_block()
    names = {Path(name).name for name in _table_examples()}
    assert "refund-desk.json" in names and "client-tools.json" in names
    for name in names:
        runs_it = f"examples/{name}" in block or (
            name == "client-tools.json" and "python -m examples.client_tools" in block
        )
        assert runs_it, f"docs/tool-calling.md lists examples/{name} as runnable but its block never runs it"


def test_every_documented_example_runs_under_make_dev(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    port = _free_port()
    env = make_dev_env()
    dev_log, out_log = tmp_path / "dev.log", tmp_path / "block.log"
    dev = start_make_dev(clone, env, port, dev_log)
    block = None
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", dev, dev_log)
        script = "set -euo pipefail\n" + _documented_block()
        commands_env = {**env, "STEVORA_URL": f"http://127.0.0.1:{port}"}
        with out_log.open("wb") as sink:
            block = subprocess.Popen(
                ["bash", "-c", script], cwd=clone, env=commands_env, stdout=sink, stderr=subprocess.STDOUT
            )
        approved: set[str] = set()
        deadline = time.monotonic() + 300
        while block.poll() is None:
            assert time.monotonic() < deadline, f"the block did not finish:\n{_tail(out_log)}"
            for approval in set(APPROVE.findall(out_log.read_text())) - approved:
                # "run that from a third terminal"
                done = subprocess.run(
                    [str(BIN / "stevora"), "approve", approval, "--by", "a new user"],
                    cwd=clone, env=commands_env, capture_output=True, text=True, timeout=60, check=False,
                )  # fmt: skip
                assert done.returncode == 0, done.stdout + done.stderr
                approved.add(approval)
            time.sleep(0.3)
        out = out_log.read_text()
        assert block.returncode == 0, f"the documented block failed:\n{out}\n--- make dev:\n{_tail(dev_log)}"
    finally:
        for proc in (block, dev):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert "TOOL_NOT_REGISTERED" not in out, out
    assert out.count("COMPLETED in") == _documented_block().count("--watch"), out  # every run followed
    assert "COMPLETED:" in out, out  # examples.client_tools' run
    assert len(approved) == 1 and "issue_refund" in out, out
