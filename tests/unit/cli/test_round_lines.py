"""`stevora runs show` per round: input tokens, the cached part and the context left, the same
words as the run page's waterfall; a `compact` summary call is marked."""

from __future__ import annotations

from stevora.cli import render
from stevora.client import LlmCall
from stevora.round_usage import round_usage


def _call(round_: int, **fields: object) -> LlmCall:
    base = {"id": f"llm_{round_}", "workflow_run_id": "wfrun_1", "step_name": "agent", "round": round_}
    return LlmCall.model_validate({"model": "gpt-4o", "status": "completed", **base, **fields})


def test_each_round_says_its_input_cached_share_and_context_and_a_compaction_is_marked() -> None:
    calls = [
        _call(1, input_tokens=1200, cache_read_tokens=0, output_tokens=30),
        _call(2, input_tokens=24_000, cache_read_tokens=23_040, output_tokens=40),
        _call(
            3,
            input_tokens=24_100,
            output_tokens=500,
            request={
                "compaction": {"through": 1, "roundsCompacted": 1, "tokensBefore": 24100, "tokensAfter": 900}
            },
        ),
        _call(4, status="failed", input_tokens=0),
    ]
    lines = render.round_lines(calls)
    assert lines[0] == "[bold]Rounds[/bold]" and len(lines) == 4  # the failed call is not a round
    assert "#1" in lines[1] and "in 1200 · cached 0 (0%) · ctx 1230" in lines[1]
    assert "in 24.0k · cached 23.0k (96%) · ctx 24.0k" in lines[2]
    assert "compaction" in lines[3] and "summarised 1 rounds (24100 → 900 tok)" in lines[3]
    assert render.round_lines([]) == []


def test_round_usage_without_input_has_no_share() -> None:
    assert round_usage(0, 0, 0) == "in 0 · cached 0 · ctx 0"
