"""Reasoning survives a worker SIGKILLed between tool rounds: real worker processes on a real
broker call the fake provider through the real SDKs. The resuming worker rebuilds the transcript
from the committed rows and still sends every earlier reasoning item / thinking block, unchanged
(the fake answers 400 to a request without them, so a lost item fails the run)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stevora.engine import commands
from stevora.testing.fake_llm import FakeLLMServer, FakeResponse, anthropic_text, anthropic_tool_use
from stevora.testing.fake_responses import reasoning_agent_responder
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.test_crash_recovery import assert_gap_free, wait_status
from tests.e2e.workerproc import WorkerProcess

ROUNDS = 3


def _thinking_agent(body: dict[str, Any]) -> FakeResponse:
    """An Anthropic model with thinking on: `effect` once per round, then an answer."""
    done = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if done >= ROUNDS:
        return anthropic_text(f"done after {done} rounds", thinking="all done")
    call = (f"toolu_{done + 1}", "effect", {"note": f"round {done + 1}"})
    return anthropic_tool_use([call], thinking=f"round {done + 1}: call effect", redacted_thinking=done == 0)


def _reasoning_in(kind: str, body: dict[str, Any]) -> list[str]:
    """The reasoning a request carries, as the JSON text of each item in the order of its keys on
    the wire (so equal texts are equal bytes), in order."""
    if kind == "responses":
        return [json.dumps(i) for i in body["input"] if i.get("type") == "reasoning"]
    return [
        json.dumps({k: v for k, v in b.items() if k != "cache_control"})
        for m in body["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] in ("thinking", "redacted_thinking")
    ]


@pytest.mark.broker
@pytest.mark.parametrize("kind", ["responses", "anthropic"])
async def test_reasoning_goes_back_every_round_after_the_worker_is_killed_between_rounds(
    broker_setup: BrokerSetup, kind: str
) -> None:
    setup = broker_setup
    with FakeLLMServer() as fake:
        if kind == "responses":
            fake.responses.responder = reasoning_agent_responder("effect", ROUNDS, argument="note")
            # No `api` on the step: the worker's STEVORA_OPENAI_API decides.
            step: dict[str, Any] = {"model": "o4-mini", "reasoning": {"effort": "low"}}
        else:
            fake.anthropic.responder = _thinking_agent
            step = {"model": "claude-sonnet-4-5", "maxTokens": 4096, "thinking": {"budgetTokens": 1024}}
        spec = {
            "name": f"reasoning-{kind}",
            "version": "1",
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "messages": [{"role": "user", "content": "record three effects"}],
                    "tools": ["effect"],
                    **step,
                }
            ],
        }
        def_id = await create_definition(setup.rt, setup.workspace_id, spec)
        env = {
            "OPENAI_API_KEY": "test",
            "OPENAI_BASE_URL": fake.openai_base_url,
            "STEVORA_OPENAI_API": "responses",
            "ANTHROPIC_API_KEY": "test",
            "ANTHROPIC_BASE_URL": fake.anthropic_base_url,
        }
        db_url, broker = setup.rt.settings.database_url, setup.url
        # Killed right after round 2's model call is committed, before its tool call runs.
        first = WorkerProcess(db_url, broker, setup.queue, fault="llm_call_committed:2", extra_env=env)
        second = None
        try:
            run, _ = await commands.create_run(setup.rt, setup.workspace_id, def_id)
            assert await first.wait_exit(40) == -9, first.log_tail()
            second = WorkerProcess(db_url, broker, setup.queue, extra_env=env)
            row = await wait_status(setup, run["id"], "COMPLETED", "FAILED", workers=(first, second))
            assert row["status"] == "COMPLETED", (row["error"], second.log_tail())
        finally:
            first.stop()
            if second:
                second.stop()
        script = fake.responses if kind == "responses" else fake.anthropic
        bodies = [r.json for r in script.requests]
    assert row["state"]["agent"] == f"done after {ROUNDS} rounds"
    # Rounds 1 and 2 before the kill, 3 and 4 after it: nothing committed was sent again.
    assert len(bodies) == ROUNDS + 1
    carried = [_reasoning_in(kind, body) for body in bodies]
    answered = carried[-1]  # the last request carries every earlier round's reasoning
    expected_items = ROUNDS + (1 if kind == "anthropic" else 0)  # + the one redacted block
    assert len(answered) == expected_items
    for items in carried:
        # Each request carries exactly the reasoning of the rounds before it, the same bytes each time.
        assert items == answered[: len(items)]
    assert carried[0] == []
    assert all(len(carried[i]) < len(carried[i + 1]) for i in range(ROUNDS))
    calls = await setup.rt.pool.fetch(
        "SELECT round, reasoning_tokens FROM llm_calls WHERE workflow_run_id = $1 AND status = 'completed' "
        "ORDER BY round",
        run["id"],
    )
    assert [c["round"] for c in calls] == [1, 2, 3, 4] and all(c["reasoning_tokens"] > 0 for c in calls)
    types = await assert_gap_free(setup, run["id"])
    assert types.count("TOOL_CALL_COMPLETED") == ROUNDS
