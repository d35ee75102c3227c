"""Schedules: the API, and the workers' due pass run in-process (exactly one run per tick)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from api_helpers import Tenant

from stevora.triggers import schedules

pytestmark = pytest.mark.timeout(60)

QUICK = [{"name": "pause", "type": "wait", "durationMs": 0}]
SLOW = [{"name": "pause", "type": "wait", "durationMs": 600_000}]


async def _definition(client: httpx.AsyncClient, tenant: Tenant, name: str, steps: list[Any]) -> str:
    body = {"name": name, "version": "1.0.0", "steps": steps}
    response = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return str(response.json()["data"]["id"])


async def _schedule(client: httpx.AsyncClient, tenant: Tenant, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/schedules", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return dict(response.json()["data"])


async def _runs_of(harness: Any, schedule_id: str) -> list[Any]:
    return list(
        await harness.rt.pool.fetch(
            "SELECT r.id, r.input, r.status, t.scheduled_at FROM schedule_ticks t "
            "JOIN workflow_runs r ON r.id = t.run_id WHERE t.schedule_id = $1 ORDER BY t.scheduled_at",
            schedule_id,
        )
    )


async def _backdate(harness: Any, schedule_id: str, by: timedelta) -> None:
    """As if no worker had run for `by`: the schedule's anchor and next tick move into the past."""
    await harness.rt.pool.execute(
        "UPDATE schedules SET created_at = created_at - $2::interval, next_fire_at = next_fire_at - $2::interval, "
        "next_due_at = next_due_at - $2::interval WHERE id = $1",
        schedule_id,
        by,
    )


async def test_a_schedule_shows_its_next_five_fire_times_also_while_paused(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    await _definition(client, tenant, "digest", QUICK)
    made = await _schedule(
        client, tenant, definitionName="digest", cron="0 9 * * 1-5", timezone="Europe/Berlin", paused=True
    )
    assert made["paused"] is True and made["version"] == "latest"
    times = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in made["nextFireTimes"]]
    assert len(times) == 5 and times == sorted(times)
    for t in times:
        local = t.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
        assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
    listed = await client.get("/v1/schedules", headers=tenant.headers)
    assert [s["id"] for s in listed.json()["data"]] == [made["id"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cron": "* * *"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"intervalS": 5, "timezone": "Mars/Olympus"}, "timezone"),
        ({"intervalS": 0}, "intervalS"),
        ({"intervalS": 5, "overlap": "sometimes"}, "overlap"),
    ],
)
async def test_a_bad_schedule_is_a_400_naming_the_field(
    client: httpx.AsyncClient, tenant: Tenant, body: dict[str, Any], field: str
) -> None:
    await _definition(client, tenant, "digest", QUICK)
    response = await client.post(
        "/v1/schedules", json={"definitionName": "digest", **body}, headers=tenant.headers
    )
    assert response.status_code == 400, response.text
    assert field in response.text


async def test_cron_and_interval_together_or_an_unknown_definition_are_refused(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    await _definition(client, tenant, "digest", QUICK)
    both = await client.post(
        "/v1/schedules",
        json={"definitionName": "digest", "cron": "* * * * *", "intervalS": 5},
        headers=tenant.headers,
    )
    assert both.status_code == 400 and "exactly one of cron and intervalS" in both.text
    unknown = await client.post(
        "/v1/schedules", json={"definitionName": "nope", "intervalS": 5}, headers=tenant.headers
    )
    assert unknown.status_code == 404


async def test_racing_due_passes_make_one_run_per_tick_with_its_scheduled_at(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _definition(client, tenant, "tick", QUICK)
    made = await _schedule(
        client,
        tenant,
        definitionName="tick",
        intervalS=1,
        overlap="allow",
        input={"at": "{{schedule.scheduledAt}}", "fixed": 1},
    )
    for _ in range(3):
        await asyncio.sleep(1.05)
        await asyncio.gather(*(schedules.due_pass(harness.rt) for _ in range(4)))
    found = await _runs_of(harness, made["id"])
    ticks = [r["scheduled_at"] for r in found]
    assert len(found) >= 2 and len(set(ticks)) == len(ticks)
    keys = await harness.rt.pool.fetch(
        "SELECT idempotency_key FROM workflow_runs WHERE workspace_id = $1", tenant.workspace_id
    )
    assert len(keys) == len(found)
    for run in found:
        assert run["input"] == {"at": run["scheduled_at"].isoformat(), "fixed": 1}
    got = await client.get(f"/v1/schedules/{made['id']}", headers=tenant.headers)
    assert {r["runId"] for r in got.json()["data"]["lastRuns"]} == {r["id"] for r in found}


async def test_skip_never_starts_a_tick_while_the_previous_run_is_active(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _definition(client, tenant, "slow", SLOW)
    made = await _schedule(client, tenant, definitionName="slow", intervalS=1, overlap="skip")
    for _ in range(3):
        await asyncio.sleep(1.05)
        await schedules.due_pass(harness.rt)
    assert len(await _runs_of(harness, made["id"])) == 1
    row = await harness.rt.pool.fetchrow(
        "SELECT ticks_run, ticks_skipped FROM schedules WHERE id = $1", made["id"]
    )
    assert row["ticks_run"] == 1 and row["ticks_skipped"] >= 1


async def test_cancel_previous_cancels_the_active_run_and_starts_the_tick(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _definition(client, tenant, "slow", SLOW)
    made = await _schedule(client, tenant, definitionName="slow", intervalS=1, overlap="cancel_previous")
    await asyncio.sleep(1.05)
    await schedules.due_pass(harness.rt)
    before = await _runs_of(harness, made["id"])
    assert before  # a loaded machine may have let a second tick fall due already
    await asyncio.sleep(1.05)
    await schedules.due_pass(harness.rt)
    runs = await _runs_of(harness, made["id"])
    assert len(runs) > len(before) and runs[0]["id"] == before[0]["id"]
    # Each new tick cancelled the run before it: only the newest is still going.
    assert all(r["status"] == "CANCELLED" for r in runs[:-1]) and runs[-1]["status"] != "CANCELLED"


async def test_buffer_one_runs_one_buffered_tick_when_the_previous_run_ends(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _definition(client, tenant, "slow", SLOW)
    made = await _schedule(client, tenant, definitionName="slow", intervalS=1, overlap="buffer_one")
    for _ in range(3):
        await asyncio.sleep(1.05)
        await schedules.due_pass(harness.rt)
    first = await _runs_of(harness, made["id"])
    assert len(first) == 1
    buffered = await harness.rt.pool.fetchval("SELECT buffered_at FROM schedules WHERE id = $1", made["id"])
    assert buffered is not None
    await client.post(f"/v1/workflow-runs/{first[0]['id']}/cancel", headers=tenant.headers)
    await schedules.due_pass(harness.rt)
    after = await _runs_of(harness, made["id"])
    assert len(after) == 2 and after[1]["scheduled_at"] == buffered


async def test_a_paused_schedule_starts_nothing_and_resuming_skips_what_was_missed(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _definition(client, tenant, "tick", QUICK)
    made = await _schedule(client, tenant, definitionName="tick", intervalS=1, paused=True)
    await asyncio.sleep(2.1)
    await schedules.due_pass(harness.rt)
    assert await _runs_of(harness, made["id"]) == []
    resumed = await client.patch(
        f"/v1/schedules/{made['id']}", json={"paused": False}, headers=tenant.headers
    )
    assert resumed.status_code == 200 and resumed.json()["data"]["paused"] is False
    resumed_at = datetime.fromisoformat(resumed.json()["data"]["updatedAt"].replace("Z", "+00:00"))
    await schedules.due_pass(harness.rt)
    # Ticks missed while paused are not run: any run now is of a tick after the resume.
    assert all(r["scheduled_at"] > resumed_at for r in await _runs_of(harness, made["id"]))


async def test_catch_up_makes_one_run_for_the_latest_missed_tick_inside_the_window(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _definition(client, tenant, "tick", QUICK)
    made = await _schedule(client, tenant, definitionName="tick", intervalS=60, catchupWindowS=300)
    await _backdate(harness, made["id"], timedelta(minutes=10))
    await schedules.due_pass(harness.rt)
    found = await _runs_of(harness, made["id"])
    assert len(found) == 1
    now = datetime.now(UTC)
    assert now - timedelta(seconds=61) < found[0]["scheduled_at"] <= now
    row = await harness.rt.pool.fetchrow(
        "SELECT ticks_skipped, next_fire_at FROM schedules WHERE id = $1", made["id"]
    )
    assert row["ticks_skipped"] == 9 and row["next_fire_at"] > now


async def test_missed_ticks_older_than_the_catch_up_window_are_all_skipped(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _definition(client, tenant, "tick", QUICK)
    made = await _schedule(client, tenant, definitionName="tick", cron="0 0 1 1 *", catchupWindowS=60)
    # The yearly tick of last January 1st: long outside the window.
    last_year = datetime(datetime.now(UTC).year, 1, 1, tzinfo=UTC)
    await harness.rt.pool.execute(
        "UPDATE schedules SET next_fire_at = $2, next_due_at = $2 WHERE id = $1", made["id"], last_year
    )
    await schedules.due_pass(harness.rt)
    assert await _runs_of(harness, made["id"]) == []
    row = await harness.rt.pool.fetchrow(
        "SELECT ticks_skipped, next_fire_at FROM schedules WHERE id = $1", made["id"]
    )
    assert row["ticks_skipped"] == 1 and row["next_fire_at"].year == last_year.year + 1


async def test_trigger_now_and_backfill_run_each_tick_once(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    await _definition(client, tenant, "tick", QUICK)
    made = await _schedule(client, tenant, definitionName="tick", cron="0 * * * *", paused=True)
    now = await client.post(f"/v1/schedules/{made['id']}/trigger", headers=tenant.headers)
    assert now.status_code == 201, now.text
    window = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T03:00:00Z"}
    first = await client.post(f"/v1/schedules/{made['id']}/backfill", json=window, headers=tenant.headers)
    again = await client.post(f"/v1/schedules/{made['id']}/backfill", json=window, headers=tenant.headers)
    assert first.status_code == 200, first.text
    assert [r["scheduledAt"] for r in first.json()["data"]] == [
        f"2026-01-01T0{h}:00:00.000Z" for h in range(4)
    ]
    assert first.json()["data"] == again.json()["data"]
    assert len(await _runs_of(harness, made["id"])) == 5
    backwards = await client.post(
        f"/v1/schedules/{made['id']}/backfill",
        json={"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
        headers=tenant.headers,
    )
    assert backwards.status_code == 400 and "to" in backwards.text


async def test_a_definitions_schedule_is_kept_in_step_with_its_newest_version(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    body: dict[str, Any] = {
        "name": "nightly",
        "version": "1",
        "steps": QUICK,
        "schedule": {"cron": "0 2 * * *"},
    }
    assert (
        await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    ).status_code == 201
    listed = (await client.get("/v1/schedules", headers=tenant.headers)).json()["data"]
    assert [(s["name"], s["cron"], s["source"]) for s in listed] == [("nightly", "0 2 * * *", "definition")]
    body |= {"version": "2", "schedule": {"cron": "30 3 * * *", "timezone": "America/New_York"}}
    assert (
        await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    ).status_code == 201
    listed = (await client.get("/v1/schedules", headers=tenant.headers)).json()["data"]
    assert [(s["cron"], s["timezone"]) for s in listed] == [("30 3 * * *", "America/New_York")]
    body = {"name": "nightly", "version": "3", "steps": QUICK}
    assert (
        await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    ).status_code == 201
    assert (await client.get("/v1/schedules", headers=tenant.headers)).json()["data"] == []


async def test_patch_delete_and_other_workspaces(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    await _definition(client, tenant, "tick", QUICK)
    made = await _schedule(client, tenant, definitionName="tick", intervalS=60, name="every-minute")
    assert (await client.get(f"/v1/schedules/{made['id']}", headers=other_tenant.headers)).status_code == 404
    changed = await client.patch(
        f"/v1/schedules/{made['id']}", json={"cron": "*/5 * * * *", "intervalS": None}, headers=tenant.headers
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["data"]["cron"] == "*/5 * * * *"
    bad = await client.patch(f"/v1/schedules/{made['id']}", json={"intervalS": 10}, headers=tenant.headers)
    assert bad.status_code == 400
    deleted = await client.delete(f"/v1/schedules/{made['id']}", headers=tenant.headers)
    assert deleted.status_code == 200
    assert (await client.get(f"/v1/schedules/{made['id']}", headers=tenant.headers)).status_code == 404


async def test_the_ui_shows_schedules_and_events_and_pauses_resumes_and_triggers(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any
) -> None:
    from stevora.ui.auth import COOKIE_NAME, csrf_token_for

    await _definition(client, tenant, "tick", QUICK)
    made = await _schedule(client, tenant, definitionName="tick", cron="15 4 * * *", name="early")
    await client.post("/v1/events", json={"name": "thing.happened", "id": "ui-1"}, headers=tenant.headers)
    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        page = await client.get("/ui/schedules")
        assert page.status_code == 200 and "early" in page.text and "Trigger now" in page.text
        csrf = {"csrf": csrf_token_for(tenant.key)}
        paused = await client.post(f"/ui/schedules/{made['id']}/pause", data=csrf)
        assert paused.status_code == 303
        assert (await client.get(f"/v1/schedules/{made['id']}", headers=tenant.headers)).json()["data"][
            "paused"
        ]
        assert "Resume" in (await client.get("/ui/schedules")).text
        await client.post(f"/ui/schedules/{made['id']}/resume", data=csrf)
        triggered = await client.post(f"/ui/schedules/{made['id']}/trigger", data=csrf)
        assert triggered.status_code == 303
        runs = await _runs_of(harness, made["id"])
        assert len(runs) == 1
        assert runs[0]["id"] in (await client.get("/ui/schedules")).text
        forged = await client.post(f"/ui/schedules/{made['id']}/trigger", data={"csrf": "nope"})
        assert forged.status_code in (400, 403) and len(await _runs_of(harness, made["id"])) == 1
        events = await client.get("/ui/events")
        assert events.status_code == 200 and "thing.happened" in events.text and "ui-1" in events.text
    finally:
        client.cookies.delete(COOKIE_NAME)


async def test_a_definition_with_a_schedule_and_triggers_applies_twice_as_the_same_definition(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    from stevora.client import AsyncAgentRuntime

    spec: dict[str, Any] = {
        "name": "applied",
        "version": "1",
        "steps": QUICK,
        "schedule": {"cron": "0 6 * * *", "timezone": "Europe/Berlin"},
        "triggers": [{"event": "thing.done", "if": "data.ok == true"}],
    }
    transport = client._transport  # the in-process app, as the api fixtures use it
    async with AsyncAgentRuntime(tenant.key, base_url="http://test", transport=transport) as sdk:  # type: ignore[arg-type]
        first = await sdk.definitions.apply(spec)
        again = await sdk.definitions.apply(spec)
    assert first.id == again.id
    stored = (await client.get(f"/v1/workflow-definitions/{first.id}", headers=tenant.headers)).json()["data"]
    assert stored["schedule"]["cron"] == "0 6 * * *" and stored["triggers"][0]["if"] == "data.ok == true"


@pytest.mark.parametrize("batched", [True, False], ids=["set-based", "one-by-one"])
async def test_more_schedules_than_a_batch_each_run_their_tick_once_and_a_bad_one_holds_none_back(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any, batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stevora.definitions.triggers import ScheduleTiming
    from stevora.triggers import schedule_store

    await _definition(client, tenant, "tick", QUICK)
    strict = {"name": "strict", "version": "1", "steps": QUICK, "inputSchema": {
        "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}  # fmt: skip
    made = await client.post("/v1/workflow-definitions", json=strict, headers=tenant.headers)
    assert made.status_code == 201, made.text
    timing = ScheduleTiming(interval_s=3600, overlap="skip", input={"at": "{{schedule.scheduledAt}}"})
    monkeypatch.setattr(schedules, "BATCH", 20)  # batches of a size a test can fill quickly
    monkeypatch.setattr(schedules, "BATCH_ALONE", 8)
    count = 50
    ids = [
        (await schedule_store.create(harness.rt, tenant.workspace_id, timing, name=None, definition_id=None,
                                     definition_name="strict" if n == 7 else "tick", version="latest"))["id"]
        for n in range(count)
    ]  # fmt: skip
    bad = ids[7]
    await harness.rt.pool.execute(
        "UPDATE schedules SET next_fire_at = clock_timestamp() - interval '0.2 s', "
        "next_due_at = clock_timestamp() - interval '0.2 s' WHERE workspace_id = $1",
        tenant.workspace_id,
    )
    passes = [schedules.due_pass(harness.rt, batched=batched) for _ in range(3)]
    await asyncio.gather(*passes, schedules.due_pass(harness.rt, batched=not batched))
    rows = await harness.rt.pool.fetch(
        "SELECT s.id, s.ticks_run, s.ticks_skipped, s.next_fire_at > clock_timestamp() AS advanced, "
        "count(t.run_id) AS ticks, count(DISTINCT r.idempotency_key) AS keys FROM schedules s "
        "LEFT JOIN schedule_ticks t ON t.schedule_id = s.id LEFT JOIN workflow_runs r ON r.id = t.run_id "
        "WHERE s.workspace_id = $1 GROUP BY s.id",
        tenant.workspace_id,
    )
    by_id = {r["id"]: r for r in rows}
    assert by_id[bad]["ticks"] == 0 and by_id[bad]["ticks_skipped"] == 1 and by_id[bad]["advanced"]
    good = [by_id[i] for i in ids if i != bad]
    assert {(r["ticks"], r["keys"], r["ticks_run"], r["advanced"]) for r in good} == {(1, 1, 1, True)}
    runs = await harness.rt.pool.fetch(
        "SELECT r.input, t.scheduled_at, s.last_run_id = r.id AS last FROM schedule_ticks t "
        "JOIN workflow_runs r ON r.id = t.run_id JOIN schedules s ON s.id = t.schedule_id "
        "WHERE s.workspace_id = $1",
        tenant.workspace_id,
    )
    assert len(runs) == count - 1
    assert all(r["input"] == {"at": r["scheduled_at"].isoformat()} and r["last"] for r in runs)
    # Every started run was handed to the dispatcher once.
    sent = [run_id for run_id, _ in harness.rt.dispatcher.sent]
    started = await harness.rt.pool.fetch(
        "SELECT id FROM workflow_runs WHERE workspace_id = $1", tenant.workspace_id
    )
    assert {r["id"] for r in started} <= set(sent)


async def test_a_batch_the_database_refuses_is_handled_again_one_schedule_at_a_time(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncpg

    from stevora.engine import commands

    await _definition(client, tenant, "tick", QUICK)
    made = [await _schedule(client, tenant, definitionName="tick", intervalS=3600) for _ in range(3)]
    await harness.rt.pool.execute(
        "UPDATE schedules SET next_fire_at = clock_timestamp() - interval '0.2 s', "
        "next_due_at = clock_timestamp() - interval '0.2 s' WHERE workspace_id = $1",
        tenant.workspace_id,
    )
    refused: list[int] = []

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        refused.append(1)
        raise asyncpg.exceptions.CheckViolationError("a row the batch statement refused")

    monkeypatch.setattr(commands, "insert_runs", refuse)
    started = await schedules.due_pass(harness.rt)
    assert refused  # the set-based statement failed, and rolled back as a whole
    for schedule in made:
        runs = await _runs_of(harness, schedule["id"])
        assert len(runs) == 1 and runs[0]["id"] in started
