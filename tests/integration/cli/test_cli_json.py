"""`--json` on every command that acts on a run, as docs/cli.md promises: stdout holds one JSON
document (the API's field names), progress lines go to stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stevora.cli import app
from tests.conftest import Harness
from tests.integration.cli.conftest import Cli
from tests.integration.cli.test_cli_remote import GREET_THEN_REVIEW, register_handlers, write_definition

RUN_COMMANDS = [
    ["run"], ["approve"], ["runs", "list"], ["runs", "show"], ["runs", "events"], ["runs", "llm-calls"],
    ["runs", "traces"], ["runs", "cancel"], ["runs", "retry"], ["runs", "pause"], ["runs", "resume"],
    ["runs", "signal"], ["runs", "tool-outputs"],
]  # fmt: skip


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=" ".join)
def test_every_run_command_offers_json(command: list[str]) -> None:
    shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "--json" in shown.output, shown.output


async def test_run_json_prints_the_created_run_and_with_watch_the_finished_one(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, [{"type": "task", "name": "greet", "handler": "greet"}])
    created = await cli("run", str(path), "-i", "name=Ada", "--json")
    assert created.exit_code == 0, created.output
    run = json.loads(created.stdout)
    assert run["id"].startswith("wfrun_") and run["status"] == "PENDING" and run["input"] == {"name": "Ada"}
    assert run["id"] in created.stderr  # the "Run … of …" line, kept off stdout

    watched = await cli("run", str(path), "-i", "name=Bo", "--watch", "--json")
    assert watched.exit_code == 0, watched.output
    final = json.loads(watched.stdout)  # only the finished run: the progress lines are on stderr
    assert final["status"] == "COMPLETED" and final["state"] == {"greeting": "Hello, Bo"}
    assert "✓ greet" in watched.stderr and "COMPLETED in" in watched.stderr


async def test_approve_json_prints_the_decided_approval(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, GREET_THEN_REVIEW)
    run = json.loads((await cli("run", str(path), "--json")).stdout)
    await harness.wait_for_status(run["id"], "WAITING")
    decided = await cli("approve", run["id"], "--by", "ann", "--json")
    assert decided.exit_code == 0, decided.output
    approval = json.loads(decided.stdout)
    assert approval["workflowRunId"] == run["id"] and approval["status"] == "DECIDED"
    assert approval["decision"] == "approved"
    assert approval["decidedBy"] == "ann"
