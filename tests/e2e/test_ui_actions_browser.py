"""Acting from the web UI in headless Chromium: run commands (cancel, pause, resume, retry,
signal), starting a run from a definition page, the runs search and live refresh, the waterfall,
the provider beside the model, who decided an approval, and dark mode."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stevora.engine import commands
from stevora.ui.waterfall import MIN_WIDTH_PCT
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.test_ui_browser import _approval_run, _tool_loop_run
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context

PAYMENT_FLOW = {
    "name": "payment-flow", "version": "1",
    "steps": [
        {"type": "external_event", "name": "await-payment", "signalType": "payment.received"},
        {"type": "task", "name": "ship", "handler": "ship_order"},
    ],
}  # fmt: skip


async def _accept_dialogs(page: Any) -> None:
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))


async def _status(harness: Harness, run_id: str) -> str:
    return await harness.rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", run_id)  # type: ignore[no-any-return]


async def test_cancel_signal_pause_resume_and_retry_act_on_the_run_from_its_page(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    shipped: list[Any] = []

    async def ship(ctx: Any) -> dict[str, Any]:
        shipped.append(ctx.workflow_state.get("amount"))
        return {"status": "completed", "output": {"shipped": True}}

    harness.tasks.register("ship_order", ship)
    def_id = await create_definition(harness.rt, workspace_id, PAYMENT_FLOW)
    to_cancel, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    to_signal, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(to_cancel["id"], "WAITING")
    await harness.wait_for_status(to_signal["id"], "WAITING")
    page = await context.new_page()
    await _accept_dialogs(page)

    # Cancel: confirm, the run and its waiting step end CANCELLED.
    await login(page, ui_server.api_key, f"/ui/runs/{to_cancel['id']}")
    await page.click("button[data-action=cancel]")
    await page.locator(".flash-ok").wait_for()
    assert "Cancelled the run." in await page.locator(".flash-ok").inner_text()
    assert await _status(harness, to_cancel["id"]) == "CANCELLED"
    await page.locator(".run-header .pill-cancelled").wait_for()
    assert await page.locator("button[data-action=cancel]").count() == 0

    # Signal: the form is prefilled with the awaited signal type; a bad payload names the field.
    await page.goto(f"/ui/runs/{to_signal['id']}")
    assert await page.input_value("#signal-type") == "payment.received"
    await page.fill("#signal-payload", "{amount: 42")
    await page.click("button[data-action=signal]")
    await page.locator(".flash-error").wait_for()
    assert "payload: not valid JSON" in await page.locator(".flash-error").inner_text()
    assert await _status(harness, to_signal["id"]) == "WAITING"
    await page.fill("#signal-type", "payment.refunded")
    await page.fill("#signal-payload", '{"amount": 42}')
    await page.click("button[data-action=signal]")
    await page.locator(".flash-error").wait_for()
    assert "SIGNAL_MISMATCH" in await page.locator(".flash-error").inner_text()
    await screenshot(page, "10-run-signal-form")
    await page.fill("#signal-type", "payment.received")
    await page.fill("#signal-payload", '{"amount": 42}')
    await page.click("button[data-action=signal]")
    await page.locator(".flash-ok").wait_for()
    row = await harness.wait_for_status(to_signal["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED" and row["state"]["amount"] == 42 and shipped == [42]

    # Pause a RUNNING run, then resume it; it completes.
    gate = asyncio.Event()
    attempts: list[int] = []

    async def slow(ctx: Any) -> dict[str, Any]:
        attempts.append(1)
        if len(attempts) == 1:
            await gate.wait()
        return {"status": "completed", "output": {"attempts": len(attempts)}}

    harness.tasks.register("slow_step", slow)
    slow_def = await create_definition(harness.rt, workspace_id, {
        "name": "slow-flow", "version": "1", "steps": [{"type": "task", "name": "work", "handler": "slow_step"}],
    })  # fmt: skip
    slow_run, _ = await commands.create_run(harness.rt, workspace_id, slow_def, {})
    await harness.wait_for_status(slow_run["id"], "RUNNING")
    await page.goto(f"/ui/runs/{slow_run['id']}")
    await page.click("button[data-action=pause]")
    await page.locator(".flash-ok").wait_for()
    assert await _status(harness, slow_run["id"]) == "PAUSED"
    gate.set()
    await page.locator("button[data-action=resume]").wait_for()
    await screenshot(page, "11-run-paused")
    await page.click("button[data-action=resume]")
    await page.locator(".flash-ok").wait_for()
    assert "Resumed" in await page.locator(".flash-ok").inner_text()
    assert (await harness.wait_for_status(slow_run["id"], "COMPLETED", "FAILED"))["status"] == "COMPLETED"

    # Retry a FAILED run: the failed step runs again and the run completes.
    calls: list[int] = []

    async def flaky(ctx: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("card processor timed out")
        return {"status": "completed"}

    harness.tasks.register("charge", flaky)
    flaky_def = await create_definition(harness.rt, workspace_id, {
        "name": "charge-flow", "version": "1",
        "steps": [{"type": "task", "name": "charge", "handler": "charge", "retry": {"maxAttempts": 1}}],
    })  # fmt: skip
    failed, _ = await commands.create_run(harness.rt, workspace_id, flaky_def, {})
    await harness.wait_for_status(failed["id"], "FAILED")
    await page.goto(f"/ui/runs/{failed['id']}")
    await page.click("button[data-action=retry]")
    await page.locator(".flash-ok").wait_for()
    assert (await harness.wait_for_status(failed["id"], "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    assert len(calls) == 2


async def test_action_posts_without_the_csrf_token_change_nothing(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    harness.tasks.register("ship_order", lambda ctx: {"status": "completed"})
    def_id = await create_definition(harness.rt, workspace_id, PAYMENT_FLOW)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "WAITING")
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    for action, form in (("cancel", {}), ("signal", {"signalType": "payment.received"})):
        forged = await page.request.post(
            f"/ui/runs/{run['id']}/{action}", form={**form, "csrf": "0" * 64}, max_redirects=0
        )
        assert forged.status == 403
    forged = await page.request.post(
        f"/ui/definitions/{def_id}/runs", form={"input": "{}", "csrf": "bad"}, max_redirects=0
    )
    assert forged.status == 403
    assert await _status(harness, run["id"]) == "WAITING"
    assert (
        await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs WHERE definition_id = $1", def_id)
        == 1
    )


async def test_a_run_starts_from_the_definition_page_only_with_a_valid_input(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "greeter", "version": "2",
        "steps": [
            {"type": "llm", "name": "write", "model": "scripted", "provider": "scripted",
             "messages": [{"role": "user", "content": "Greet {{input.name}} from {{ input.city }}"}]},
        ],
    })  # fmt: skip
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/definitions/{def_id}")
    # The editor is prefilled with the keys the templates read.
    assert json.loads(await page.input_value("#run-input")) == {"name": "", "city": ""}

    async def runs_of_definition() -> int:
        return await harness.rt.pool.fetchval(  # type: ignore[no-any-return]
            "SELECT count(*) FROM workflow_runs WHERE definition_id = $1", def_id
        )

    await page.fill("#run-input", '{"name": "Ada",')
    assert "not valid JSON" in await page.locator("#run-input-status").inner_text()  # checked while typing
    await page.click("button[data-action=start]")
    await page.locator("#start-error").wait_for()
    assert "input: not valid JSON" in await page.locator("#start-error").inner_text()
    assert await page.input_value("#run-input") == '{"name": "Ada",'  # the text is kept to fix it

    await page.fill("#run-input", '["Ada"]')
    await page.click("button[data-action=start]")
    assert "input: must be a JSON object" in await page.locator("#start-error").inner_text()

    await page.fill("#run-input", '{"name": "Ada"}')
    await page.click("button[data-action=start]")
    error = await page.locator("#start-error").inner_text()
    assert "input.city: missing" in error and "steps[0].messages[0].content" in error
    await screenshot(page, "12-start-run-error")
    assert await runs_of_definition() == 0

    await page.fill("#run-input", '{"name": "Ada", "city": "Lisbon"}')
    assert "✓" in await page.locator("#run-input-status").inner_text()
    await page.click("button[data-action=start]")
    await page.wait_for_url("**/ui/runs/wfrun_*")
    run_id = page.url.rsplit("/", 1)[-1]
    assert f"Started run {run_id}" in await page.locator(".flash-ok").inner_text()
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    assert row["input"] == {"name": "Ada", "city": "Lisbon"} and await runs_of_definition() == 1


async def test_runs_list_searches_by_id_status_definition_and_time_and_refreshes_live(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    def_id = await create_definition(
        harness.rt, workspace_id,
        {"name": "ingest", "version": "1", "steps": [{"type": "task", "name": "t", "handler": "h"}]},
    )  # fmt: skip
    insert = (
        "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, created_at) "
        "VALUES ($1, $2, $3, $4, $5::text::timestamptz)"
    )
    for run_id, status, created in (
        ("wfrun_alpha01", "COMPLETED", "2026-03-01T10:00:00Z"),
        ("wfrun_alpha02", "FAILED", "2026-03-02T10:00:00Z"),
        ("wfrun_beta001", "COMPLETED", "2026-03-05T10:00:00Z"),
    ):
        await harness.rt.pool.execute(insert, run_id, workspace_id, def_id, status, created)
    page = await context.new_page()
    await login(page, ui_server.api_key)

    async def listed() -> list[str]:
        return [
            t.strip()
            for t in await page.locator("table.runs-table tbody tr td:first-child").all_inner_texts()
        ]

    await page.fill("input[name=q]", "wfrun_alpha")
    await page.click("#run-filters button[type=submit]")
    await page.wait_for_url("**q=wfrun_alpha**")
    assert await listed() == ["wfrun_alpha02", "wfrun_alpha01"]
    await page.fill("input[name=from]", "2026-03-01T12:00")
    await page.fill("input[name=to]", "2026-03-06T00:00")
    await page.click("#run-filters button[type=submit]")
    await page.wait_for_url("**from=2026-03-01T12%3A00**")
    assert await listed() == ["wfrun_alpha02"]
    await page.goto(f"/ui/runs?definition={def_id}&status=COMPLETED&from=2026-03-01T00:00")
    assert await listed() == ["wfrun_beta001", "wfrun_alpha01"]
    await page.goto("/ui/runs?from=yesterday")
    assert "from: not a date-time" in await page.locator(".flash-error").inner_text()

    # Live: a run created after the page loaded appears without a reload.
    await page.goto(f"/ui/runs?definition={def_id}")
    await page.evaluate("window.__notReloaded = true")
    assert "wfrun_gamma01" not in await listed()
    await harness.rt.pool.execute(
        insert, "wfrun_gamma01", workspace_id, def_id, "RUNNING", "2026-03-09T10:00:00Z"
    )
    await page.locator("a[href='/ui/runs/wfrun_gamma01']").wait_for(timeout=10_000)
    assert await page.evaluate("window.__notReloaded === true")
    assert (await listed())[0] == "wfrun_gamma01"
    await screenshot(page, "13-runs-search")


async def test_waterfall_provider_decider_and_dark_mode(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    loop_run, _ = await _tool_loop_run(harness, workspace_id)
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{loop_run}")

    # Waterfall: 1 step, 4 model rounds, 4 tool calls, each a bar inside the time axis.
    assert await page.locator(".wf-step").count() == 1
    assert await page.locator(".wf-model").count() == 4
    assert await page.locator(".wf-tool").count() == 4
    step_box = await page.locator(".wf-step .wf-bar").bounding_box()
    assert step_box is not None and step_box["width"] > 0
    boxes = [
        await bar.bounding_box() for bar in await page.locator(".wf-model .wf-bar, .wf-tool .wf-bar").all()
    ]
    track = await page.locator(".wf-step .wf-track").bounding_box()
    assert track is not None
    slack = 2 + track["width"] * MIN_WIDTH_PCT / 100  # an instant call is drawn MIN_WIDTH_PCT wide
    for box in boxes:  # every round and tool call lies inside its step on the time axis
        assert box is not None
        assert step_box["x"] - 2 <= box["x"]
        assert box["x"] + box["width"] <= step_box["x"] + step_box["width"] + slack
    lefts = [(await b.bounding_box() or {"x": 0})["x"] for b in await page.locator(".wf-model .wf-bar").all()]
    assert lefts == sorted(lefts)  # rounds follow one another on the axis

    # The provider beside every model: the offline scripted answer is labelled as such.
    rounds = page.locator(".round-head")
    assert await rounds.count() == 4
    for head in await rounds.all():
        assert "scripted · offline" in await head.inner_text()
    await screenshot(page, "14-run-waterfall")

    # Dark mode follows prefers-color-scheme.
    light = await page.evaluate("getComputedStyle(document.body).backgroundColor")
    await page.emulate_media(color_scheme="dark")
    dark = await page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert light != dark
    red, green, blue = (int(v) for v in dark.removeprefix("rgb(").removesuffix(")").split(","))
    assert red + green + blue < 150
    await screenshot(page, "15-run-dark")
    await page.emulate_media(color_scheme="light")

    # An approval decided in the UI records the signed-in key, not free text.
    run_id, approval_id = await _approval_run(harness, workspace_id, "decider")
    await page.goto("/ui/approvals")
    await page.locator(f"[data-approval-id='{approval_id}'] button[value=approved]").click()
    await page.locator(".flash-ok").wait_for()
    key_id = await harness.rt.pool.fetchval(
        "SELECT id FROM api_keys WHERE key_hash = encode(sha256($1::bytea), 'hex')",
        ui_server.api_key.encode(),
    )
    decided_by = await harness.rt.pool.fetchval(
        "SELECT decided_by FROM approval_requests WHERE id = $1", approval_id
    )
    assert decided_by == f"browser tests ({key_id}) via UI"
    assert f"browser tests ({key_id}) via UI" in await page.locator("table").last.inner_text()
    await harness.wait_for_status(run_id, "COMPLETED")
