"""`stevora runs llm-calls` shows a streamed call's time to first token (and none for the rest)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from stevora.llm.scripted_provider import ScriptedProvider
from tests.conftest import Harness
from tests.integration.cli.conftest import Cli
from tests.integration.cli.test_cli_remote import run_id_of, write_definition


async def test_llm_calls_show_the_time_to_first_token_of_streamed_calls(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    # A scripted provider with a delay answers like a stream: first token after half of it.
    harness.rt.providers.register("slow", ScriptedProvider(name="slow", latency_s=0.4))
    path = write_definition(tmp_path, [
        {"type": "llm", "name": "slow", "model": "gpt-4o", "provider": "slow",
         "messages": [{"role": "user", "content": "take your time"}]},
        {"type": "llm", "name": "quick", "model": "gpt-4o", "provider": "scripted",
         "messages": [{"role": "user", "content": "be quick"}]},
    ])  # fmt: skip
    run_id = run_id_of(await cli("run", str(path), "--watch"))

    calls = json.loads((await cli("runs", "llm-calls", run_id, "--json")).stdout)
    assert [c["stepName"] for c in calls] == ["slow", "quick"]
    assert 200 <= calls[0]["timeToFirstTokenMs"] < calls[0]["durationMs"]
    assert calls[1]["timeToFirstTokenMs"] is None
    lines = (await cli("runs", "llm-calls", run_id)).output.splitlines()
    [slow_line] = [line for line in lines if "slow #1" in line]
    [quick_line] = [line for line in lines if "quick #1" in line]
    shown = re.search(r"\(first token (\d+) ms\)", slow_line)
    assert shown is not None, slow_line
    assert abs(int(shown.group(1)) - calls[0]["timeToFirstTokenMs"]) <= 1
    assert "first token" not in quick_line
