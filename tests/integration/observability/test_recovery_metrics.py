"""The recovery sweep's pickups and failed webhook deliveries are counted."""

from __future__ import annotations

import socket

from stevora.db.outbox import enqueue_webhooks
from stevora.engine import commands
from stevora.engine.sweep import sweep_once
from stevora.events import WebhookEvent
from stevora.ids import new_id
from stevora.observability import metrics
from stevora.webhooks import deliver_due
from tests.conftest import Harness, create_definition


async def test_runs_the_sweep_dispatches_are_counted(harness: Harness, workspace_id: str) -> None:
    spec = {"name": "swept", "version": "1", "steps": [{"type": "wait", "name": "w", "durationMs": 0}]}
    def_id = await create_definition(harness.rt, workspace_id, spec)
    executing = harness.dispatcher.run_pool
    harness.dispatcher.run_pool = None  # the dispatch is lost: only the sweep can pick the run up
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    harness.dispatcher.run_pool = executing
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET dispatched_at = now() - interval '1 hour' WHERE id = $1", run["id"]
    )
    before = metrics.SWEEP_PICKUPS._value.get()
    picked = await sweep_once(harness.rt)
    assert run["id"] in picked
    assert metrics.SWEEP_PICKUPS._value.get() - before == len(picked)
    await harness.wait_for_status(run["id"], "COMPLETED")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_failed_webhook_deliveries_are_counted_and_the_last_one_is_final(
    harness: Harness, workspace_id: str
) -> None:
    harness.rt.settings = harness.rt.settings.model_copy(update={"webhook_max_attempts": 2})
    await harness.rt.pool.execute(
        "INSERT INTO webhooks (id, workspace_id, url, events, secret) VALUES ($1, $2, $3, $4, 'whsec_test')",
        new_id("wh"),
        workspace_id,
        f"http://127.0.0.1:{_closed_port()}/hook",
        ["workflow.completed"],
    )
    async with harness.rt.pool.acquire() as conn:
        await enqueue_webhooks(
            conn, workspace_id, WebhookEvent.WORKFLOW_COMPLETED, {"workflowRunId": "wfrun_x"}
        )
    retrying = metrics.WEBHOOK_FAILURES.labels(final="false")
    final = metrics.WEBHOOK_FAILURES.labels(final="true")
    before = (retrying._value.get(), final._value.get())
    assert await deliver_due(harness.rt) >= 1
    assert retrying._value.get() - before[0] >= 1
    await harness.rt.pool.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = now() WHERE workspace_id = $1", workspace_id
    )
    assert await deliver_due(harness.rt) >= 1
    assert final._value.get() - before[1] >= 1
    row = await harness.rt.pool.fetchrow(
        "SELECT status, attempts FROM webhook_deliveries WHERE workspace_id = $1", workspace_id
    )
    assert (row["status"], row["attempts"]) == ("FAILED", 2)
