"""The run page in headless Chromium shows a streamed model answer growing live under its running
step (the stream's llm.text.delta messages), then the stored answer once the call is recorded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from stevora.engine import commands
from stevora.llm.openai_provider import OpenAIProvider
from stevora.testing.fake_llm import FakeLLMServer, openai_text
from stevora.testing.fake_stream import StreamDefaults
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context

ANSWER = "Lisbon is sunny at 21 degrees, Oslo has sleet at 4; pack a light jacket for one and a coat for the other."
PIECES = 8


@pytest.fixture
async def slow_openai(harness: Harness) -> AsyncIterator[FakeLLMServer]:
    # Slow enough for a person (and the test) to watch: the first token after 2 s, then 8 pieces.
    with FakeLLMServer(stream=StreamDefaults(first_token_s=2.0, chunk_delay_s=0.6, chunks=PIECES)) as fake:
        client = openai.AsyncOpenAI(api_key="test", base_url=fake.openai_base_url, max_retries=0)
        harness.rt.providers.register("openai", OpenAIProvider("test", client=client))
        async with harness.rt.live.subscribe("warm-up"):
            pass
        yield fake
        await client.close()


async def test_the_run_page_shows_streamed_text_live_then_the_stored_answer(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any, slow_openai: FakeLLMServer
) -> None:
    slow_openai.openai.enqueue(openai_text(ANSWER))
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "trip-advice", "version": "1",
        "steps": [{"type": "llm", "name": "advise", "model": "gpt-4o-mini",
                   "messages": [{"role": "user", "content": "Lisbon or Oslo this week?"}]}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    await page.locator(".run-header .pill-running").wait_for()

    live = page.locator(".live-text .message-text")
    await live.wait_for(timeout=10_000)  # visible once the first delta arrived
    first = await live.inner_text()
    assert first and ANSWER.startswith(first) and first != ANSWER
    # It grows while the call is still in flight (no stored round for it yet).
    for _ in range(100):
        grown = await live.inner_text() if await live.count() else ""
        if len(grown) > len(first):
            break
        await asyncio.sleep(0.05)
    assert len(grown) > len(first) and ANSWER.startswith(grown)
    assert await page.locator(".round").count() == 0
    await screenshot(page, "08-run-streaming-live")

    await page.locator(".run-header .pill-completed").wait_for(timeout=15_000)
    await page.locator(".round .assistant .message-text").wait_for()
    assert await page.locator(".round .assistant .message-text").inner_text() == ANSWER
    assert await page.locator(".live-text").count() == 0
    assert "first token" in await page.locator(".round-meta").inner_text()
    await screenshot(page, "09-run-streamed-answer-stored")
