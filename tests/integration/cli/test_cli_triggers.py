"""`stevora schedules ...` and `stevora events send` (through the Python client) against a live server."""

from __future__ import annotations

import json

from tests.conftest import Harness, create_definition
from tests.integration.cli.conftest import Cli

QUICK = [{"name": "pause", "type": "wait", "durationMs": 0}]


async def test_schedules_from_create_to_pause_trigger_backfill_and_delete(
    cli: Cli, harness: Harness, workspace_id: str
) -> None:
    await create_definition(harness.rt, workspace_id, {"name": "digest", "version": "1", "steps": QUICK})
    made = await cli(
        "schedules", "create", "digest", "--cron", "0 9 * * *", "--timezone", "America/New_York",
        "--input", '{"at": "{{schedule.scheduledAt}}"}', "--json",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    schedule = json.loads(made.output)
    assert schedule["cron"] == "0 9 * * *" and len(schedule["nextFireTimes"]) == 5
    listed = await cli("schedules", "list")
    assert schedule["id"] in listed.output and "active" in listed.output
    paused = await cli("schedules", "pause", schedule["id"])
    assert paused.exit_code == 0 and "paused" in paused.output
    triggered = await cli("schedules", "trigger", schedule["id"])
    assert triggered.exit_code == 0 and triggered.output.strip().startswith("wfrun_")
    backfilled = await cli(
        "schedules",
        "backfill",
        schedule["id"],
        "--from",
        "2026-01-01T00:00:00Z",
        "--to",
        "2026-01-02T23:59:59Z",
    )
    assert backfilled.exit_code == 0, backfilled.output
    assert [line.split()[0] for line in backfilled.output.strip().splitlines()] == [
        "2026-01-01T14:00:00+00:00", "2026-01-02T14:00:00+00:00"
    ]  # fmt: skip
    shown = await cli("schedules", "show", schedule["id"])
    assert shown.output.count("ran:") == 3 and "(backfill)" in shown.output and "(manual)" in shown.output
    bad = await cli("schedules", "create", "digest", "--cron", "not a cron")
    assert bad.exit_code == 1 and "cron" in bad.output
    deleted = await cli("schedules", "delete", schedule["id"])
    assert deleted.exit_code == 0
    assert (await cli("schedules", "show", schedule["id"])).exit_code == 1


async def test_events_send_prints_the_runs_it_started_and_a_repeat_the_same(
    cli: Cli, harness: Harness, workspace_id: str
) -> None:
    await create_definition(harness.rt, workspace_id, {"name": "paid", "version": "1", "steps": QUICK})
    await harness.rt.pool.execute(
        "INSERT INTO event_triggers (workspace_id, definition_name, trigger_index, definition_id, event_name, spec) "
        "SELECT $1::text, 'paid', 0, id, 'order.paid', '{\"event\": \"order.paid\"}'::jsonb FROM workflow_definitions "
        "WHERE workspace_id = $1::text AND name = 'paid'",
        workspace_id,
    )
    first = await cli("events", "send", "order.paid", "--data", '{"orderId": "o1"}', "--id", "e1", "--json")
    assert first.exit_code == 0, first.output
    runs = json.loads(first.output)["runs"]
    assert len(runs) == 1 and runs[0]["kind"] == "started"
    again = await cli("events", "send", "order.paid", "--data", '{"orderId": "o1"}', "--id", "e1")
    assert "(seen before)" in again.output and runs[0]["runId"] in again.output
    listed = await cli("events", "list", "--name", "order.paid")
    assert listed.output.count("e1") == 1
    bad = await cli("events", "send", "order.paid", "--data", "[1]")
    assert bad.exit_code == 2
