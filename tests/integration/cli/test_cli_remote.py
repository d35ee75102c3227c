"""`stevora keys|definitions|run|runs|approve` against the real API on a local uvicorn server."""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from stevora.engine.steps.approval import decide_approval
from stevora.ids import new_id
from tests.conftest import Harness
from tests.integration.cli.conftest import Cli

RUN_ID = re.compile(r"wfrun_[0-9a-z]+")
GREET_THEN_REVIEW = [
    {"type": "task", "name": "greet", "handler": "greet"},
    {"type": "approval", "name": "review", "contentKey": "greeting"},
]
TOOL = {
    "name": "lookup",
    "description": "Look a thing up",
    "parameters": {"type": "object", "properties": {}},
}


def register_handlers(harness: Harness) -> None:
    async def greet(ctx: Any) -> dict[str, Any]:
        who = ctx.workflow_input.get("name", "world")
        return {"status": "completed", "stateUpdates": {"greeting": f"Hello, {who}"}}

    def broken(ctx: Any) -> None:
        raise RuntimeError("the printer is on fire")

    harness.tasks.register("greet", greet)
    harness.tasks.register("broken", broken)
    harness.tools.register("lookup", lambda input: {"found": True})


def write_definition(folder: Path, steps: list[dict[str, Any]], name: str | None = None) -> Path:
    path = folder / "workflow.yaml"
    path.write_text(yaml.safe_dump({"name": name or new_id("wf"), "version": 1, "steps": steps}))
    return path


def run_id_of(result: Any) -> str:
    found = RUN_ID.search(result.output)
    assert found, result.output
    return found.group(0)


async def test_run_watch_shows_each_step_llm_round_and_tool_call_then_exits_zero(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, [
        {"type": "task", "name": "greet", "handler": "greet"},
        {"type": "wait", "name": "nap", "durationMs": 200},
        {"type": "llm", "name": "agent", "model": "scripted", "tools": [TOOL],
         "messages": [{"role": "user", "content": "{{state.greeting}}"}]},
    ])  # fmt: skip
    result = await cli("run", str(path), "--input", "name=Ada", "--input", "n=3", "--watch")
    assert result.exit_code == 0, result.output
    out = result.output
    for expected in ("▶ greet (task)", "✓ greet", "nap waiting until", "✓ nap", "▶ agent (llm)",
                     "round 1 scripted", "→ lookup", "⚙ lookup completed", "round 2 scripted", "✓ agent",
                     "COMPLETED in", "LLM cost $"):  # fmt: skip
        assert expected in out, out
    assert out.index("✓ greet") < out.index("✓ nap") < out.index("⚙ lookup") < out.index("COMPLETED in")
    row = await harness.rt.pool.fetchrow(
        "SELECT input, status FROM workflow_runs WHERE id = $1", run_id_of(result)
    )
    assert row["input"] == {"name": "Ada", "n": 3} and row["status"] == "COMPLETED"


async def test_run_watch_of_a_failing_run_shows_retries_and_exits_one(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    register_handlers(harness)
    path = write_definition(
        tmp_path,
        [
            {
                "type": "task",
                "name": "print",
                "handler": "broken",
                "retry": {"maxAttempts": 2, "backoffMs": 100},
            }
        ],
    )
    result = await cli("run", str(path), "--watch")
    assert result.exit_code == 1, result.output
    assert re.search(r"↻ print retrying in \d+ ms \(attempt 2/2\)", result.output), result.output
    assert "▶ print (task attempt 2)" in result.output
    assert "✗ print failed: STEP_FAILED: RuntimeError: the printer is on fire" in result.output
    assert "FAILED in" in result.output


async def test_run_watch_waits_through_an_approval_decided_elsewhere(
    cli: Cli, harness: Harness, workspace_id: str, tmp_path: Path
) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, GREET_THEN_REVIEW)
    watching = asyncio.ensure_future(cli("run", str(path), "--watch"))
    approval_id = None
    for _ in range(500):
        approval_id = await harness.rt.pool.fetchval(
            "SELECT id FROM approval_requests WHERE workspace_id = $1 AND status = 'PENDING'", workspace_id
        )
        if approval_id is not None:
            break
        await asyncio.sleep(0.02)
    assert approval_id is not None
    await decide_approval(harness.rt, workspace_id, approval_id, "approved", decided_by="ann")
    result = await asyncio.wait_for(watching, 15)
    assert result.exit_code == 0, result.output
    assert f"waiting for approval — stevora approve {approval_id}" in result.output
    assert "review approved by ann" in result.output and "COMPLETED in" in result.output


async def test_approve_continues_a_waiting_run_and_reject_fails_it(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, GREET_THEN_REVIEW)
    edited_run = run_id_of(await cli("run", str(path), "--input", "name=Bo"))
    rejected_run = run_id_of(await cli("run", str(path)))
    await harness.wait_for_status(edited_run, "WAITING")
    await harness.wait_for_status(rejected_run, "WAITING")

    approval_id = await harness.rt.pool.fetchval(
        "SELECT id FROM approval_requests WHERE workflow_run_id = $1", edited_run
    )
    edited = await cli("approve", approval_id, "--edit", "Hi Bo!", "--by", "ann")
    assert edited.exit_code == 0, edited.output
    assert f"edited {approval_id} (review); run {edited_run} continues" in edited.output
    done = await harness.wait_for_status(edited_run, "COMPLETED")
    assert done["state"]["greeting"] == "Hi Bo!"

    rejected = await cli("approve", rejected_run, "--reject")  # a run id finds its pending approval
    assert rejected.exit_code == 0, rejected.output
    failed = await harness.wait_for_status(rejected_run, "FAILED")
    assert failed["error"]["code"] == "APPROVAL_REJECTED"

    again = await cli("approve", approval_id)
    assert again.exit_code == 1 and "INVALID_STATE_TRANSITION" in again.output


async def test_runs_list_show_and_events_describe_a_finished_run(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, [{"type": "task", "name": "greet", "handler": "greet"}])
    run_id = run_id_of(await cli("run", str(path), "--input-json", '{"name": "Cy"}'))
    await harness.wait_for_status(run_id, "COMPLETED")

    listed = await cli("runs", "list")
    assert listed.exit_code == 0 and run_id in listed.output and "COMPLETED" in listed.output
    assert run_id not in (await cli("runs", "list", "--status", "failed")).output

    shown = await cli("runs", "show", run_id)
    assert shown.exit_code == 0, shown.output
    assert run_id in shown.output and "Hello, Cy" in shown.output
    assert re.search(r"1\s+greet\s+task\s+COMPLETED\s+1\s+\d+ ms", shown.output), shown.output

    events = await cli("runs", "events", run_id)
    followed = await cli("runs", "events", run_id, "--follow")
    for result in (events, followed):
        assert result.exit_code == 0, result.output
        types = re.findall(r"^\s+\d+\s+\S+\s+([A-Z_]+)", result.output, re.MULTILINE)
        assert types[0] == "WORKFLOW_STARTED" and types[-1] == "WORKFLOW_COMPLETED", result.output
        assert "STEP_COMPLETED" in types


async def test_definitions_apply_reads_yaml_prints_the_id_and_is_idempotent(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, [{"type": "task", "name": "greet", "handler": "greet"}])
    first = await cli("definitions", "apply", str(path))
    assert first.exit_code == 0, first.output
    definition_id = first.stdout.strip().splitlines()[-1]
    stored = await harness.rt.pool.fetchrow(
        "SELECT name, version FROM workflow_definitions WHERE id = $1", definition_id
    )
    assert stored is not None and stored["version"] == "1"
    assert (await cli("definitions", "apply", str(path))).stdout.strip().splitlines()[-1] == definition_id

    by_name = await cli("run", stored["name"], "--version", "1", "--idempotency-key", "once")
    again = await cli("run", definition_id, "--idempotency-key", "once")
    assert run_id_of(by_name) == run_id_of(again)
    assert "existing run for this idempotency key" in again.output

    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "bad", "version": "1", "steps": [{"type": "task", "name": "x"}]}')
    invalid = await cli("definitions", "apply", str(bad))
    assert invalid.exit_code == 1 and "VALIDATION_ERROR" in invalid.output and "steps[0]" in invalid.output


async def test_keys_create_prints_a_working_key_once(cli: Cli, harness: Harness) -> None:
    created = await cli("keys", "create", "ci")
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("stv_") and "cannot be shown again" in created.output
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert await harness.rt.pool.fetchval("SELECT name FROM api_keys WHERE key_hash = $1", digest) == "ci"

    fresh = new_id("ws")
    await harness.rt.pool.execute("INSERT INTO workspaces (id, name, slug) VALUES ($1, 'New', $2)", fresh,
                                  fresh.replace("_", "-"))  # fmt: skip
    first = await cli("keys", "create", "first", "--workspace-id", fresh, env={"STEVORA_API_KEY": None})
    assert first.exit_code == 0, first.output
    listed = await cli("runs", "list", env={"STEVORA_API_KEY": first.stdout.strip().splitlines()[-1]})
    assert listed.exit_code == 0 and "0 total" in listed.output


async def test_errors_exit_one_with_the_api_error_code(cli: Cli) -> None:
    missing = await cli("runs", "show", "wfrun_missing")
    assert missing.exit_code == 1 and "NOT_FOUND (404): Workflow run not found" in missing.output
    denied = await cli("runs", "list", env={"STEVORA_API_KEY": "stv_" + "0" * 32})
    assert denied.exit_code == 1 and "AUTH_ERROR (401)" in denied.output
    unreachable = await cli("runs", "list", "--url", "http://127.0.0.1:1")
    assert unreachable.exit_code == 1 and "cannot reach the server" in unreachable.output
    bad_input = await cli("run", "whatever", "--input", "no-equals-sign")
    assert bad_input.exit_code == 2 and "key=value" in bad_input.output


async def test_run_watch_of_the_same_file_twice_with_a_tool_referenced_by_name(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    register_handlers(harness)
    path = write_definition(tmp_path, [
        {"type": "llm", "name": "agent", "model": "scripted", "tools": ["lookup"],
         "messages": [{"role": "user", "content": "Find it"}]},
    ])  # fmt: skip
    first = await cli("run", str(path), "--watch")
    second = await cli("run", str(path), "--watch")
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    assert "CONFLICT" not in second.output and "COMPLETED in" in second.output
    assert run_id_of(first) != run_id_of(second)
