"""`POST /v1/retries`: every FAILED run of a definition in a time window (or of
a list), a dry-run count first, each retried as the single-run retry, one run's failure reported
without stopping the others."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from api_helpers import DefinitionFactory, Tenant


async def _failed_runs(
    client: httpx.AsyncClient, tenant: Tenant, harness: Any, definition_id: str, n: int
) -> list[str]:
    ids = []
    for _ in range(n):
        made = await client.post(
            "/v1/workflow-runs", json={"definitionId": definition_id, "input": {}}, headers=tenant.headers
        )
        assert made.status_code == 201, made.text
        ids.append(made.json()["data"]["id"])
    for run_id in ids:
        await harness.wait_for_status(run_id, "FAILED")
    return ids


async def test_retry_every_failed_run_of_a_definition_with_a_dry_run_first(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Any
) -> None:
    attempts: dict[str, int] = {}

    async def flaky(ctx: Any) -> dict[str, Any]:
        attempts[ctx.workflow_run_id] = attempts.get(ctx.workflow_run_id, 0) + 1
        if attempts[ctx.workflow_run_id] == 1:
            raise RuntimeError("upstream down")
        return {"status": "completed"}

    harness.tasks.register("flaky", flaky)
    step = [{"type": "task", "name": "f", "handler": "flaky", "retry": {"maxAttempts": 1}}]
    target = await define(step, name="billing")
    other = await define(step, name="other")
    # First, a FAILED run that failed before any step ran: the single-run retry refuses it.
    [broken] = await _failed_runs(client, tenant, harness, target, 1)
    failed = await _failed_runs(client, tenant, harness, target, 3)
    [elsewhere] = await _failed_runs(client, tenant, harness, other, 1)
    await harness.rt.pool.execute("UPDATE workflow_runs SET current_step_run_id = NULL WHERE id = $1", broken)
    url = "/v1/retries"

    dry = await client.post(url, json={"definition": "billing", "dryRun": True}, headers=tenant.headers)
    assert dry.status_code == 200, dry.text
    data = dry.json()["data"]
    assert (data["dryRun"], data["count"], data["truncated"]) == (True, 4, False)
    # Oldest failure first: the broken run, then the three (which failed concurrently).
    assert data["runIds"][0] == broken and sorted(data["runIds"][1:]) == sorted(failed)
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE status = 'FAILED' AND id = ANY($1)", [*failed, broken]
        )
        == 4
    )  # a dry run changes nothing
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    later = await client.post(
        url, json={"definition": "billing", "since": future, "dryRun": True}, headers=tenant.headers
    )
    assert later.json()["data"]["count"] == 0
    bad = await client.post(url, json={"definition": "billing", "since": "yesterday"}, headers=tenant.headers)
    assert bad.status_code == 400 and bad.json()["error"]["details"]["errors"][0]["path"] == "since"
    neither = await client.post(url, json={"dryRun": True}, headers=tenant.headers)
    assert neither.status_code == 400

    done = await client.post(url, json={"definition": "billing"}, headers=tenant.headers)
    assert done.status_code == 200, done.text
    data = done.json()["data"]
    assert data["count"] == 4 and data["retried"] == 3
    by_run = {r["runId"]: r for r in data["results"]}
    assert {by_run[i]["outcome"] for i in failed} == {"RETRIED"}
    # The broken run (oldest, tried first) is reported, and did not stop the runs after it.
    assert by_run[broken]["outcome"] == "ERROR"
    assert by_run[broken]["error"]["code"] == "INVALID_STATE_TRANSITION"
    for run_id in failed:
        await harness.wait_for_status(run_id, "COMPLETED")
    assert all(attempts[i] == 2 for i in failed)
    # The other definition's run was not touched; it is retried from a list.
    assert (await harness.rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", elsewhere)) == (
        "FAILED"
    )
    listed = await client.post(url, json={"runIds": [elsewhere, failed[0]]}, headers=tenant.headers)
    assert listed.json()["data"]["count"] == 1  # the completed run is not FAILED any more
    assert [r["runId"] for r in listed.json()["data"]["results"]] == [elsewhere]
    await harness.wait_for_status(elsewhere, "COMPLETED")
