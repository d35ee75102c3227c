"""Text output when stdout is not a terminal (a pipe, a file, a CI log): tables and lines are laid
out whole, never wrapped at rich's assumed 80 columns nor cut with `…`. Run as a real process with
stdout and stderr piped, as CI runs it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Harness
from tests.integration.cli.conftest import Cli
from tests.integration.cli.test_cli_remote import run_id_of, write_definition

ROOT = Path(__file__).resolve().parents[3]
LONG_ERROR = (
    "the upstream inventory service answered 503 for warehouse eu-central-1 twice in a row; giving up"
)
LONG_STEP = "reconcile-the-inventory-of-every-warehouse-in-the-european-union"


async def _piped(cli: Cli, *args: str) -> tuple[int, str, str]:
    """`stevora <args>` as a separate process, stdout and stderr piped (not terminals), no COLUMNS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEVORA_", "COLUMNS", "LINES"))}
    env.update(
        STEVORA_URL=cli.url, STEVORA_API_KEY=cli.api_key, STEVORA_API_KEY_FILE="", PYTHONPATH=str(ROOT)
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "stevora.cli", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_tables_on_a_pipe_keep_every_value_whole_on_one_line(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    def broken(ctx: Any) -> None:
        raise RuntimeError(LONG_ERROR)

    harness.tasks.register("broken", broken)
    path = write_definition(
        tmp_path, [{"type": "task", "name": LONG_STEP, "handler": "broken", "retry": {"maxAttempts": 1}}]
    )
    run_id = run_id_of(await cli("run", str(path)))
    await harness.wait_for_status(run_id, "FAILED")

    code, out, err = await _piped(cli, "runs", "show", run_id)
    assert code == 0, err
    step_lines = [line for line in out.splitlines() if LONG_STEP in line]
    assert len(step_lines) == 1, out  # the step's row: name, status and error on one line
    assert LONG_ERROR in step_lines[0] and "FAILED" in step_lines[0], out
    assert "…" not in out, out

    code, out, err = await _piped(cli, "runs", "list", "--status", "FAILED")
    assert code == 0, err
    row = next((line for line in out.splitlines() if run_id in line), None)
    assert row is not None and LONG_STEP in row, out
    assert "…" not in out, out
