"""The run page shows a round's thinking behind a toggle (headless Chromium): the thinking text
appears only when opened, and a redacted thinking block's data never appears as text."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from stevora.engine import commands
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.testing.fake_llm import FakeLLMServer, anthropic_text, anthropic_tool_use
from stevora.tools import ToolContext
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context

PLAN = "The user wants the stock of SKU-1; I should call check_stock first."


async def test_thinking_text_sits_behind_a_toggle_and_redacted_thinking_is_never_shown(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    @harness.tools.tool
    async def check_stock(sku: str, ctx: ToolContext) -> str:
        """Stock of a SKU."""
        return "12 left"

    with FakeLLMServer() as fake:
        first = anthropic_tool_use(
            [("toolu_1", "check_stock", {"sku": "SKU-1"})], thinking=PLAN, redacted_thinking=True
        )
        assert first.body is not None
        redacted = first.body["content"][1]["data"]
        fake.anthropic.enqueue(first, anthropic_text("12 left of SKU-1", thinking="Answer with the count."))
        client = anthropic.AsyncAnthropic(
            api_key="test", base_url=fake.anthropic_base_url, max_retries=0, open_telemetry=False
        )
        harness.rt.providers.register("anthropic", AnthropicProvider("test", name="anthropic", client=client))
        try:
            def_id = await create_definition(harness.rt, workspace_id, {
                "name": "thinking-page", "version": "1",
                "steps": [{
                    "type": "llm", "name": "agent", "model": "claude-sonnet-4-5", "maxTokens": 4096,
                    "thinking": {"budgetTokens": 1024}, "tools": ["check_stock"],
                    "messages": [{"role": "user", "content": "How many SKU-1 are left?"}],
                }],
            })  # fmt: skip
            run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
            row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
            assert row["status"] == "COMPLETED", row["error"]
        finally:
            await client.close()

    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    toggles = page.locator("details.thinking")
    assert await toggles.count() == 2  # one per round
    first_toggle = toggles.first
    assert "Thinking" in await first_toggle.locator("summary").inner_text()
    assert not await first_toggle.locator(".thinking-text").first.is_visible()  # closed until asked
    await first_toggle.locator("summary").click()
    assert await first_toggle.locator(".thinking-text").first.is_visible()
    assert PLAN in await first_toggle.inner_text()
    assert "reasoning" in await page.locator(".round-meta").first.inner_text()  # thinking tokens shown
    assert redacted not in await page.content()
    await screenshot(page, "60-run-thinking-toggle-open")
