"""Streaming against llama-cpp-python's real server: the compat adapter folds its chunks (tool-call
fragments that repeat the call's id and name, a final chunk with no usage) into the same answer a
plain call gets, the run's SSE stream carries the text live, and the time to first token is
stored. A server whose streams carry no usage is not streamed unless its capabilities say so."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.interop.conftest import TERMINAL, Interop
from tests.interop.test_llamacpp_server import WEATHER, llm_step, register


def parse_sse(body: str) -> list[dict[str, Any]]:
    """The messages of an event-stream body as {event, data, id?} (comments skipped)."""
    messages = []
    for block in body.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.split("\n") if ": " in line and not line.startswith(":")
        )
        if "data" in fields:
            messages.append({**fields, "data": json.loads(fields["data"])})
    return messages


async def _run_streamed(
    interop: Interop, steps: list[dict[str, Any]], question: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run through the API while following its event stream; (collected run, SSE messages)."""
    async with interop.harness.rt.live.subscribe("warm-up"):
        pass  # the API's LISTEN connection is up before the run starts
    run_id = await interop.start(steps, {"question": question})
    url = f"/v1/workflow-runs/{run_id}/events/stream"
    stream = asyncio.create_task(interop.client.get(url, headers=interop.tenant.headers))
    await interop.wait(run_id, *TERMINAL)
    response = await asyncio.wait_for(stream, 60)
    messages = parse_sse(response.text)
    return await interop.collect(run_id), messages


async def test_streamed_text_arrives_live_and_time_to_first_token_is_stored(interop: Interop) -> None:
    step = llm_step(provider="llamacpp-stream", maxTokens=32)
    out, messages = await _run_streamed(interop, [step], "Name three colours.")

    assert out["run"]["status"] == "COMPLETED", out["run"]["error"]
    [call] = out["calls"]
    text = call["response"]["text"]
    assert isinstance(text, str) and text.strip()
    kinds = [m["event"] for m in messages]
    deltas = [m["data"] for m in messages if m["event"] == "llm.text.delta"]
    assert deltas and kinds.index("llm.text.delta") < kinds.index("LLM_CALL_COMPLETED")
    assert max(i for i, k in enumerate(kinds) if k == "llm.text.delta") < kinds.index("LLM_CALL_COMPLETED")
    assert "".join(d["text"] for d in sorted(deltas, key=lambda d: d["offset"])) == text
    assert {d["provider"] for d in deltas} == {"llamacpp-stream"}
    assert 0 < call["timeToFirstTokenMs"] < call["durationMs"]
    assert (call["inputTokens"], call["outputTokens"]) == (0, 0)  # its streams carry no usage


async def test_a_streamed_tool_call_joins_the_same_arguments_as_the_plain_call(interop: Interop) -> None:
    seen: list[dict[str, Any]] = []
    register(interop, "get_weather", {"temp_c": 21, "sky": "sunny"}, seen)
    question = "What is the weather in Paris?"
    plain_step = llm_step(
        tools=[WEATHER], toolChoice={"name": "get_weather"}, maxToolRounds=1, onMaxToolRounds="complete"
    )
    plain = await interop.run([plain_step], {"question": question})
    streamed, _ = await _run_streamed(interop, [{**plain_step, "provider": "llamacpp-stream"}], question)

    assert plain["run"]["status"] == streamed["run"]["status"] == "COMPLETED", streamed["run"]["error"]
    first_plain, first_streamed = plain["calls"][0], streamed["calls"][0]
    # The default capabilities (usage: true, stream_usage: false) keep "llamacpp" unstreamed.
    assert first_plain["timeToFirstTokenMs"] is None and first_plain["inputTokens"] > 0
    assert first_streamed["timeToFirstTokenMs"] is not None
    plain_calls, streamed_calls = (
        first_plain["response"]["toolCalls"],
        first_streamed["response"]["toolCalls"],
    )
    assert [(c["name"], c["arguments"]) for c in streamed_calls] == [
        (c["name"], c["arguments"]) for c in plain_calls
    ]
    assert streamed["traces"][0]["inputJson"] == plain["traces"][0]["inputJson"] == seen[0]
    assert len(seen) == 2
