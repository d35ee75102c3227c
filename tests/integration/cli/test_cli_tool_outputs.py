"""`stevora runs tool-outputs` and the pending client calls in `runs show|get` and `run --watch`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from stevora.engine.steps.awaited import client as tool_outputs
from stevora.ids import new_id
from tests.awaited_tools import LOCATION, WEATHER
from tests.conftest import Harness
from tests.integration.cli.conftest import Cli
from tests.integration.cli.test_cli_remote import run_id_of


def agent_file(folder: Path, *tools: Any) -> Path:
    step = {"type": "llm", "name": "agent", "model": "scripted", "tools": list(tools),
            "messages": [{"role": "user", "content": "What should I wear?"}]}  # fmt: skip
    path = folder / "agent.json"
    path.write_text(json.dumps({"name": new_id("agent"), "version": "1", "steps": [step]}))
    return path


async def latest_run(harness: Harness, workspace_id: str) -> str:
    for _ in range(500):
        run_id: str | None = await harness.rt.pool.fetchval(
            "SELECT id FROM workflow_runs WHERE workspace_id = $1 ORDER BY created_at DESC LIMIT 1",
            workspace_id,
        )
        if run_id:
            return run_id
        await asyncio.sleep(0.02)
    raise AssertionError("no run was created")


async def pending_calls(harness: Harness, run_id: str) -> list[str]:
    for _ in range(500):
        rows = await harness.rt.pool.fetch(
            "SELECT tool_call_id FROM awaited_tool_calls WHERE workflow_run_id = $1 AND status = 'pending' "
            "ORDER BY sequence",
            run_id,
        )
        if rows:
            return [r["tool_call_id"] for r in rows]
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {run_id} never waited for tool outputs")


async def test_watch_shows_the_pending_calls_and_how_they_were_answered(
    cli: Cli, harness: Harness, workspace_id: str, tmp_path: Path
) -> None:
    # CliRunner swaps the process's stdout, so the answers come from the engine, not another command.
    watching = asyncio.ensure_future(cli("run", str(agent_file(tmp_path, WEATHER, LOCATION)), "--watch"))
    run_id = await latest_run(harness, workspace_id)
    weather_id, location_id = await pending_calls(harness, run_id)
    await asyncio.sleep(0.3)  # let the watcher print the pause before the run moves on
    items = [
        tool_outputs.ToolOutput(weather_id, output="sunny"),
        tool_outputs.ToolOutput(location_id, error="denied"),
    ]
    await tool_outputs.submit_tool_outputs(harness.rt, workspace_id, run_id, items)

    result = await asyncio.wait_for(watching, 20)
    assert result.exit_code == 0, result.output
    out = result.output
    for expected in ("agent waiting for tool outputs:", f"{weather_id}  get_weather", f"{location_id}  get_location",
                     f"stevora runs tool-outputs {run_id} --output {weather_id}=JSON --output {location_id}=JSON",
                     "⚙ get_weather completed", "by the client", "⚙ get_location failed denied",
                     "resumed (tool_outputs)", "COMPLETED in"):  # fmt: skip
        assert expected in out, out
    assert out.index("waiting for tool outputs") < out.index("⚙ get_weather") < out.index("COMPLETED in")


async def test_runs_show_lists_the_pending_calls_and_tool_outputs_answers_them(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    started = await cli("run", str(agent_file(tmp_path, WEATHER, LOCATION)))
    assert started.exit_code == 0, started.output
    run_id = run_id_of(started)
    weather_id, location_id = await pending_calls(harness, run_id)

    for command in ("show", "get"):
        shown = await cli("runs", command, run_id)
        assert shown.exit_code == 0, shown.output
        assert "Waiting for tool outputs" in shown.output
        assert weather_id in shown.output and "get_weather" in shown.output and "get_location" in shown.output
        assert f"stevora runs tool-outputs {run_id}" in shown.output

    # A value that is not JSON is sent as a string; the run still waits for the other call.
    first = await cli("runs", "tool-outputs", run_id, "--output", f"{weather_id}=light rain")
    assert first.exit_code == 0, first.output
    assert "WAITING" in first.output and location_id in first.output
    second = await cli("runs", "tool-outputs", run_id, "--error", f"{location_id}=Permission denied")
    assert second.exit_code == 0, second.output
    assert "Waiting for tool outputs" not in second.output
    await harness.wait_for_status(run_id, "COMPLETED")
    traces = {
        r["tool_call_id"]: r
        for r in await harness.rt.pool.fetch(
            "SELECT tool_call_id, status, output_json, error FROM tool_trace WHERE workflow_run_id = $1",
            run_id,
        )
    }
    assert traces[weather_id]["output_json"] == "light rain" and traces[weather_id]["status"] == "completed"
    assert traces[location_id]["status"] == "failed" and traces[location_id]["error"] == "Permission denied"
    done = await cli("runs", "show", run_id)
    assert "COMPLETED" in done.output and "Waiting for tool outputs" not in done.output


async def test_json_values_are_parsed_and_mistakes_are_refused_without_recording(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    started = await cli("run", str(agent_file(tmp_path, LOCATION)))
    assert started.exit_code == 0, started.output
    run_id = run_id_of(started)
    (call_id,) = await pending_calls(harness, run_id)

    malformed = await cli("runs", "tool-outputs", run_id, "--output", "no-equals-sign")
    assert malformed.exit_code == 2 and "CALL_ID=VALUE" in malformed.output
    nothing = await cli("runs", "tool-outputs", run_id)
    assert nothing.exit_code == 2
    unknown = await cli("runs", "tool-outputs", run_id, "--output", f"{call_id}=1", "--output", "call_nope=2")
    assert (
        unknown.exit_code == 1 and "INVALID_TOOL_OUTPUTS" in unknown.output and "call_nope" in unknown.output
    )
    traces = "SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1"
    assert await harness.rt.pool.fetchval(traces, run_id) == 0

    answered = await cli("runs", "tool-outputs", run_id, "--output", f'{call_id}={{"lat": 38.7, "ok": true}}')
    assert answered.exit_code == 0, answered.output
    await harness.wait_for_status(run_id, "COMPLETED")
    output = await harness.rt.pool.fetchval(
        "SELECT output_json FROM tool_trace WHERE workflow_run_id = $1", run_id
    )
    assert output == {"lat": 38.7, "ok": True}


async def test_watch_shows_the_child_run_answering_a_workflow_tool(
    cli: Cli, harness: Harness, workspace_id: str, tmp_path: Path
) -> None:
    async def shout(ctx: Any) -> dict[str, Any]:
        return {"status": "completed", "stateUpdates": {"loud": "HEY"}}

    harness.tasks.register("shout", shout)
    child_name = new_id("shout")
    child = {"name": child_name, "version": "1", "defaultParams": "word",
             "steps": [{"type": "task", "name": "shout", "handler": "shout"}]}  # fmt: skip
    (tmp_path / "child.json").write_text(json.dumps(child))
    applied = await cli("definitions", "apply", str(tmp_path / "child.json"))
    assert applied.exit_code == 0, applied.output

    result = await cli("run", str(agent_file(tmp_path, {"name": "shout", "workflow": child_name})), "--watch")
    assert result.exit_code == 0, result.output
    child_id = await harness.rt.pool.fetchval(
        "SELECT id FROM workflow_runs WHERE workspace_id = $1 AND parent_run_id IS NOT NULL", workspace_id
    )
    for expected in (f"agent waiting for child run(s) {child_id}", "⚙ shout completed",
                     f"by child run {child_id}", "resumed (child_run)", "COMPLETED in"):  # fmt: skip
        assert expected in result.output, result.output
    shown = await cli("runs", "show", child_id)
    assert "Parent" in shown.output and run_id_of(result) in shown.output
