"""The run page of a long, compacting `llm` step (headless Chromium): each round of the waterfall
says its input tokens, the cached part and the context it leaves, and the `compact` summary call
is marked where the older rounds left the requests."""

from __future__ import annotations

import re
from typing import Any

import pytest

from stevora.testing.fake_llm import FakeLLMServer
from stevora.testing.fake_prompt_cache import FakePromptCache
from tests.conftest import Harness
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot
from tests.integration.loop.conftest import SdkProviders, fake, fake_llm_session, run_workflow, sdk  # noqa: F401
from tests.integration.loop.test_loop_compaction import _agent, _stateless_responder
from tests.integration.loop.test_loop_prompt_cache import LONG_SYSTEM, _register_bulky

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context


async def test_the_waterfall_shows_per_round_usage_and_marks_the_compaction(
    harness: Harness,
    workspace_id: str,
    ui_server: UiServer,
    context: Any,
    fake: FakeLLMServer,  # noqa: F811
    sdk: SdkProviders,  # noqa: F811
) -> None:
    _register_bulky(harness)
    fake.prompt_cache = FakePromptCache()
    fake.context_window_tokens = 6_000
    fake.openai.responder = _stateless_responder(8)
    context_ = {"maxInputTokens": 5_000, "strategy": "compact", "keepLastRounds": 1}
    step = _agent("gpt-4o-mini", systemPrompt=LONG_SYSTEM, context=context_)
    result = await run_workflow(harness, workspace_id, step)
    assert result.status == "COMPLETED", result.run["error"]
    compactions = result.events_of("CONTEXT_COMPACTED")
    assert compactions

    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{result.id}")
    marked = page.locator(".wf-compaction")
    assert await marked.count() == len(compactions)
    first = await marked.first.inner_text()
    assert f"compaction {compactions[0]['round']}" in first
    assert f"summarised {compactions[0]['roundsCompacted']} rounds" in first
    assert await page.locator(".wf-compaction .wf-bar-compaction").count() == len(compactions)
    # Every round: input tokens, the cached part with its share, the context it leaves.
    details = await page.locator(".wf-model .wf-detail").all_inner_texts()
    rows = [c for c in result.completed_calls() if "compaction" not in c["request"]]
    assert len(details) == len(rows)
    for text, row in zip(details, rows, strict=True):
        found = re.search(r"in (\S+) · cached (\S+)(?: \((\d+)%\))? · ctx (\S+)", text)
        assert found, text
        assert found.group(1) == str(row["input_tokens"]) or found.group(1).endswith("k")
        assert found.group(2) == str(row["cache_read_tokens"]) or found.group(2).endswith("k")
    # The prefix cache works between compactions: some round read most of its input from it.
    assert any(int(m) >= 80 for m in re.findall(r"\((\d+)%\)", " ".join(details))), details
    # In the rounds list, the compaction is named and says what it did.
    head = page.locator(".round-head", has=page.locator(".tag-compaction")).first
    assert "Compaction" in await head.inner_text()
    await screenshot(page, "60-run-compaction-waterfall")
