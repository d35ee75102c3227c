"""`stevora runs cancel|retry|pause|resume|signal|budget|llm-calls|traces`, `--json` on the reads,
`--version`, the dev key file read by default, and errors as `CODE (HTTP status)`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from stevora.engine import commands
from tests.conftest import Harness, create_definition
from tests.integration.cli.conftest import Cli
from tests.integration.cli.test_cli_remote import TOOL, register_handlers, run_id_of, write_definition

WAIT_FOR_PAYMENT = [
    {"type": "external_event", "name": "await-payment", "signalType": "payment.received"},
    {"type": "task", "name": "greet", "handler": "greet"},
]


async def test_cancel_and_signal_act_on_waiting_runs(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, WAIT_FOR_PAYMENT)
    to_cancel = run_id_of(await cli("run", str(path)))
    to_signal = run_id_of(await cli("run", str(path), "-i", "name=Di"))
    await harness.wait_for_status(to_cancel, "WAITING")
    await harness.wait_for_status(to_signal, "WAITING")

    cancelled = await cli("runs", "cancel", to_cancel)
    assert cancelled.exit_code == 0 and f"cancelled {to_cancel}: CANCELLED" in cancelled.output
    again = await cli("runs", "cancel", to_cancel)
    assert again.exit_code == 1 and "INVALID_STATE_TRANSITION (409)" in again.output

    wrong = await cli("runs", "signal", to_signal, "payment.refunded")
    assert wrong.exit_code == 1 and "SIGNAL_MISMATCH (409)" in wrong.output
    bad = await cli("runs", "signal", to_signal, "payment.received", "--payload", "[1]")
    assert bad.exit_code == 2 and "--payload" in bad.output and "JSON object" in bad.output
    sent = await cli("runs", "signal", to_signal, "payment.received", "--payload", '{"paid": 12.5}', "--json")
    assert sent.exit_code == 0, sent.output
    assert json.loads(sent.stdout)["id"] == to_signal
    done = await harness.wait_for_status(to_signal, "COMPLETED")
    assert done["state"]["paid"] == 12.5 and done["state"]["greeting"] == "Hello, Di"


async def test_pause_resume_and_retry(cli: Cli, harness: Harness, workspace_id: str) -> None:
    gate = asyncio.Event()
    calls: list[int] = []

    async def step(ctx: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            await gate.wait()
        if len(calls) == 2:
            raise RuntimeError("flaky backend")
        return {"status": "completed"}

    harness.tasks.register("step", step)
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "pausable", "version": "1",
        "steps": [{"type": "task", "name": "work", "handler": "step", "retry": {"maxAttempts": 1}}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "RUNNING")
    paused = await cli("runs", "pause", run["id"])
    assert paused.exit_code == 0 and f"paused {run['id']}: PAUSED" in paused.output, paused.output
    gate.set()
    resumed = await cli("runs", "resume", run["id"])
    assert resumed.exit_code == 0 and "resumed" in resumed.output, resumed.output
    await harness.wait_for_status(run["id"], "FAILED")  # the second execution fails
    retried = await cli("runs", "retry", run["id"])
    assert retried.exit_code == 0 and f"retrying {run['id']}" in retried.output, retried.output
    assert (await harness.wait_for_status(run["id"], "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    assert len(calls) == 3


async def test_llm_calls_and_traces_as_tables_and_json(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, [
        {"type": "llm", "name": "agent", "model": "gpt-4o", "provider": "scripted", "tools": [TOOL],
         "messages": [{"role": "user", "content": "look it up"}]},
    ])  # fmt: skip
    run_id = run_id_of(await cli("run", str(path), "--watch"))
    watched = await cli("runs", "events", run_id)
    assert watched.exit_code == 0

    calls = await cli("runs", "llm-calls", run_id)
    assert calls.exit_code == 0, calls.output
    assert "gpt-4o · scripted (offline)" in calls.output and "→ lookup" in calls.output
    calls_json = json.loads((await cli("runs", "llm-calls", run_id, "--json")).stdout)
    assert [c["round"] for c in calls_json] == [1, 2]
    assert {c["provider"] for c in calls_json} == {"scripted"} and calls_json[0]["model"] == "gpt-4o"

    traces = await cli("runs", "traces", run_id)
    assert traces.exit_code == 0 and "lookup" in traces.output and '{"found":true}' in traces.output
    traces_json = json.loads((await cli("runs", "traces", run_id, "--step", "agent", "--json")).stdout)
    assert [(t["toolName"], t["outputJson"]) for t in traces_json] == [("lookup", {"found": True})]


async def test_every_read_command_prints_json(cli: Cli, harness: Harness, tmp_path: Path) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, [{"type": "task", "name": "greet", "handler": "greet"}])
    run_id = run_id_of(await cli("run", str(path), "-i", "name=Ed"))
    await harness.wait_for_status(run_id, "COMPLETED")

    listed = json.loads((await cli("runs", "list", "--json")).stdout)
    assert listed["meta"]["total"] == 1 and listed["data"][0]["id"] == run_id
    shown = json.loads((await cli("runs", "show", run_id, "--json")).stdout)
    assert shown["status"] == "COMPLETED" and shown["state"] == {"greeting": "Hello, Ed"}
    assert [s["stepName"] for s in shown["stepRuns"]] == ["greet"]
    events = json.loads((await cli("runs", "events", run_id, "--json")).stdout)
    assert events[0]["eventType"] == "WORKFLOW_STARTED" and events[-1]["eventType"] == "WORKFLOW_COMPLETED"
    followed = (await cli("runs", "events", run_id, "--follow", "--json")).stdout.splitlines()
    assert [json.loads(line)["eventType"] for line in followed] == [e["eventType"] for e in events]


async def test_version_key_file_and_error_format(cli: Cli, api_key: str, tmp_path: Path) -> None:
    version = await cli("--version")
    assert version.exit_code == 0 and version.stdout.startswith("stevora 0.")

    key_file = tmp_path / "dev-api-key"
    key_file.write_text(api_key + "\n")
    from_file = await cli(
        "runs", "list", env={"STEVORA_API_KEY": None, "STEVORA_API_KEY_FILE": str(key_file)}
    )
    assert from_file.exit_code == 0, from_file.output

    no_key = await cli("runs", "list", env={"STEVORA_API_KEY": None})
    assert no_key.exit_code == 1
    assert "AUTH_ERROR (401)" in no_key.output and "stevora dev" in no_key.output  # says how to get a key
    invalid = await cli("runs", "list", "--status", "nope")
    assert (
        invalid.exit_code == 1 and "VALIDATION_ERROR (400)" in invalid.output and "status" in invalid.output
    )
    unreachable = await cli("runs", "show", "wfrun_x", "--url", "http://127.0.0.1:1")
    assert unreachable.exit_code == 1 and "CONNECTION_ERROR (no HTTP response)" in unreachable.output


async def test_runs_budget_shows_used_and_limits_and_a_raise_resumes_a_paused_run(
    cli: Cli, harness: Harness, workspace_id: str
) -> None:
    @harness.tools.tool
    async def lookup() -> str:
        """Look something up."""
        return "found"

    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "budgeted", "version": "1",
        "budget": {"maxToolCalls": 1, "onBudgetExceeded": "pause"},
        "steps": [{"type": "llm", "name": "agent", "model": "scripted:rounds=3", "maxToolRounds": 3,
                   "tools": ["lookup"], "messages": [{"role": "user", "content": "go"}]}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "WAITING")

    shown = await cli("runs", "budget", run["id"])
    assert shown.exit_code == 0, shown.output
    assert "tool calls 1 / 1" in shown.output and "pause for a raise" in shown.output
    bad = await cli("runs", "budget", run["id"], "--on-exceeded", "explode")
    assert bad.exit_code == 2 and "--on-exceeded" in bad.output
    raised = await cli("runs", "budget", run["id"], "--max-tool-calls", "5", "--json")
    assert raised.exit_code == 0, raised.output
    assert json.loads(raised.stdout)["budget"] == {"maxToolCalls": 5, "onBudgetExceeded": "pause"}
    done = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]
    finished = await cli("runs", "budget", run["id"], "--max-tool-calls", "9")
    assert finished.exit_code == 1 and "INVALID_STATE_TRANSITION (409)" in finished.output
