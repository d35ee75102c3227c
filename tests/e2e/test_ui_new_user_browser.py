"""What a new user tripped over in the web UI (headless Chromium): a run waiting on an
approval-gated tool call says so and can be approved from its page, the signal form only where a
signal applies, the inbox shows a gated call as a call, client-answered calls say so, a refused
tool output keeps the typed text, waterfall labels and durations readable, descriptions' `code`,
`next=` kept through a wrong key, a favicon, and API docs that load nothing from elsewhere."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import pytest
from pydantic import BaseModel

from stevora.api import create_app
from stevora.engine import commands
from stevora.settings import Settings
from stevora.tools import ToolContext
from tests.awaited_tools import LOCATION, WEATHER
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot
from tests.integration.client.live_server import serve

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context

LONG_TOOL = "search_knowledge_base_for_every_matching_article"


class Refund(BaseModel):
    orderId: str
    refunded: int


async def _gated_run(harness: Harness, workspace_id: str) -> str:
    async def issue_refund(orderId: str, amount: int, ctx: ToolContext) -> Refund:
        """Refund an order (a person approves each refund)."""
        return Refund(orderId=orderId, refunded=amount)

    harness.tools.tool(requires_approval=True)(issue_refund)
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "refund-desk", "version": "1",
        "steps": [{"type": "llm", "name": "agent", "model": "scripted", "tools": ["issue_refund"],
                   "messages": [{"role": "user", "content": "Refund order ord_1 (120 EUR)"}]}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "WAITING")
    return str(run["id"])


async def test_a_run_waiting_on_an_approval_gated_call_says_so_and_is_approved_from_its_page(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    run_id = await _gated_run(harness, workspace_id)
    page = await context.new_page()
    await login(page, ui_server.api_key, "/ui/approvals")

    # The inbox shows the call (tool and arguments), not `state.toolCall`; an edit starts from the arguments.
    card = page.locator(".approval")
    text = await card.inner_text()
    assert (
        "tool call" in text.lower()
        and "issue_refund" in text.lower()
        and "state.toolcall" not in text.lower()
    ), text
    assert "orderId" in await card.locator(".review-content").inner_text()
    await card.locator("summary:has-text('Edit')").click()
    edit = await card.locator("textarea[name=content]").input_value()
    assert '"orderId"' in edit and '"tool"' not in edit and "toolCallId" not in edit, edit
    assert "with these arguments" in await card.locator(".edit-form label").inner_text()

    await page.goto(f"/ui/runs/{run_id}")
    note = await page.locator(".step-note").inner_text()
    assert "approve" in note and "tool results from outside" not in note, note
    call = page.locator(".toolcall").first
    call_text = await call.inner_text()
    assert "awaiting approval" in call_text.lower() and "NOT RUN" not in call_text, call_text
    assert "Not recorded yet" not in call_text
    assert await page.locator("details[data-key=signal-form]").count() == 0  # a signal does not apply here
    await screenshot(page, "20-run-waiting-for-a-tool-approval")

    await call.locator("button:has-text('Approve')").click()
    await page.wait_for_url(f"**/ui/runs/{run_id}")
    await page.locator(".flash-ok").wait_for()
    done = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]
    await page.locator("#run-status .pill-completed").wait_for()
    assert "completed" in (await page.locator(".toolcall").first.inner_text()).lower()


async def test_the_signal_form_is_offered_only_to_a_run_waiting_for_a_signal(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "await-payment", "version": "1",
        "steps": [{"type": "external_event", "name": "pay", "signalType": "payment.received"}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "WAITING")
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    assert await page.locator("#signal-type").input_value() == "payment.received"


async def test_client_answered_calls_say_so_and_refused_text_is_kept(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "trip", "version": "1",
        "steps": [{"type": "llm", "name": "advise", "model": "scripted", "tools": [WEATHER, LOCATION],
                   "messages": [{"role": "user", "content": "What should I wear?"}]}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    run_id = run["id"]
    await harness.wait_for_status(run_id, "WAITING")
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run_id}")
    assert (
        await page.locator("details[data-key=signal-form]").count() == 0
    )  # waiting for tool outputs, not a signal

    first = page.locator("#tool-outputs [data-tool-call-id]").first
    call_id = await first.get_attribute("data-tool-call-id")
    typed = '{"tempC": 18, conditions: "rain"}'
    await first.locator("textarea[name=output]").fill(typed)
    await first.locator("button:has-text('Submit output')").click()
    await page.locator(".flash-error").wait_for()
    assert "not valid JSON" in await page.locator(".flash-error").inner_text()
    kept = page.locator(f"#tool-outputs [data-tool-call-id='{call_id}'] textarea[name=output]")
    assert await kept.input_value() == typed  # fix the typo instead of typing it all again

    for _ in range(2):
        pending = page.locator("#tool-outputs [data-tool-call-id]").first
        await pending.locator("textarea[name=output]").fill('{"ok": true}')
        await pending.locator("button:has-text('Submit output')").click()
        await page.locator(".flash-ok").wait_for()
    done = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]
    await page.reload()
    for card in await page.locator(".toolcall").all():
        assert "answered by the client" in await card.inner_text()


async def test_waterfall_labels_are_whole_and_durations_clear_of_the_bars(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    harness.tools.register(LONG_TOOL, lambda input: {"hits": 3}, description="Search `kb` articles")
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "kb-agent", "version": "1", "description": "Answers from the `kb` with `search`",
        "steps": [{"type": "llm", "name": "answer", "model": "scripted", "tools": [LONG_TOOL],
                   "messages": [{"role": "user", "content": "How do I reset a password?"}]}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "COMPLETED")
    page = await context.new_page()
    await page.set_viewport_size({"width": 1024, "height": 900})
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    labels = page.locator(".wf-row:not(.wf-axis) .wf-label")
    texts = await labels.all_inner_texts()
    assert any(LONG_TOOL in t for t in texts), texts
    for label in await labels.all():
        cut = await label.evaluate(
            "e => [...e.querySelectorAll('*'), e].some(x => x.scrollWidth > x.clientWidth + 1)"
        )
        assert not cut, await label.inner_text()
    for row in await page.locator(".wf-row:not(.wf-axis)").all():
        bar = await row.locator(".wf-bar").bounding_box()
        time = await row.locator(".wf-time").bounding_box()
        assert bar and time and time["x"] >= bar["x"] + bar["width"], (await row.inner_text(), bar, time)
    await screenshot(page, "21-waterfall-long-tool-name")

    # Descriptions written with `code`: rendered as code, no raw backticks.
    await page.locator("details.tools-panel > summary").click()
    desc = page.locator(".tool-desc")
    assert "`" not in await desc.inner_text() and await desc.locator("code").inner_text() == "kb"
    await page.goto(f"/ui/definitions/{def_id}")
    lead = page.locator(".lead")
    assert "`" not in await lead.inner_text() and await lead.locator("code").count() == 2
    await page.goto("/ui/definitions")
    assert "`" not in await page.locator("td.desc").first.inner_text()


async def test_a_wrong_key_keeps_where_the_user_was_going(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    page = await context.new_page()
    target = "/ui/runs?status=FAILED"
    await page.goto(target)
    await page.wait_for_url("**/ui/login?next=**")
    await page.fill("input[name=key]", "stv_wrong")
    await page.click("button[type=submit]")
    await page.locator(".flash-error").wait_for()
    assert "next=" in page.url, page.url  # a reload of the login page still knows where to go
    await page.fill("input[name=key]", ui_server.api_key)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"**{target}")


async def test_a_favicon_and_api_docs_that_load_nothing_from_elsewhere(
    harness: Harness, settings: Settings, browser: Any
) -> None:
    async with serve(create_app(settings, runtime=harness.rt)) as url:
        ctx = await browser.new_context(base_url=url)
        try:
            page = await ctx.new_page()
            # Requests that left the server: finished, or failed for any reason but the page's
            # own Content-Security-Policy (which stops them in the browser, before the network).
            left: list[str] = []

            def away(request: Any) -> bool:
                return (
                    urlparse(request.url).scheme in ("http", "https") and urlparse(request.url).port != port
                )

            port = urlparse(url).port
            page.on("requestfinished", lambda r: left.append(r.url) if away(r) else None)
            page.on(
                "requestfailed",
                lambda r: (
                    left.append(f"{r.url} {r.failure}")
                    if away(r) and "csp" not in (r.failure or "").lower()
                    else None
                ),
            )
            assert (await page.request.get("/favicon.ico")).status == 200
            for docs in ("/redoc", "/docs"):
                await page.goto(docs)
                await page.wait_for_load_state("networkidle")
            await page.goto("/redoc")
            await page.get_by_text("API docs by Redocly").wait_for()
            await page.wait_for_load_state("networkidle")
            assert left == [], left
        finally:
            await ctx.close()
