"""Reasoning kept across tool rounds in the real loop (driver, PostgreSQL checkpoints, real SDKs on
the fake): Anthropic thinking blocks and OpenAI Responses reasoning items go back unchanged on
every later round, are counted as reasoning tokens, and a fork sends the same bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stevora.engine import fork as forking
from stevora.llm.messages import Usage
from stevora.testing.fake_llm import FakeLLMServer, FakeResponse, anthropic_text, anthropic_tool_use, error
from stevora.testing.fake_responses import reasoning_agent_responder, responses_tool_calls
from stevora.tools import ToolContext
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, load_run, run_workflow


def _register_lookup(harness: Harness) -> list[int]:
    ran: list[int] = []

    @harness.tools.tool
    async def lookup(round: int, ctx: ToolContext) -> str:
        """Look the round up."""
        ran.append(round)
        return f"looked up {round}"

    return ran


def _thinking_agent(fake: FakeLLMServer, rounds: int) -> list[list[dict[str, Any]]]:
    """An Anthropic model that thinks, then calls `lookup` once per round for `rounds` rounds;
    returns the content blocks it answered, per round."""
    answered: list[list[dict[str, Any]]] = []

    def respond(body: dict[str, Any]) -> FakeResponse:
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done >= rounds:
            answer = anthropic_text(f"done after {done}", thinking="all rounds done")
        else:
            answer = anthropic_tool_use(
                [(f"toolu_{done + 1}", "lookup", {"round": done + 1})],
                thinking=f"round {done + 1}: I will look it up",
                redacted_thinking=done == 1,
            )
        assert answer.body is not None
        answered.append(answer.body["content"])
        return answer

    fake.anthropic.responder = respond
    return answered


async def test_anthropic_thinking_agent_returns_its_thinking_blocks_unchanged_for_three_rounds(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    ran = _register_lookup(harness)
    answered = _thinking_agent(fake, 3)
    step = llm_step(
        model="claude-sonnet-4-5", tools=["lookup"], maxTokens=4096, thinking={"budgetTokens": 2048}
    )
    run = await run_workflow(harness, workspace_id, step)
    assert run.status == "COMPLETED", run.run["error"]
    assert ran == [1, 2, 3]
    requests = [r.json for r in fake.anthropic.requests]
    assert len(requests) == 4
    for index, body in enumerate(requests):
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
        turns = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
        assert len(turns) == index
        for turn, blocks in zip(turns, answered, strict=False):
            thinking = [b for b in blocks if b["type"] in ("thinking", "redacted_thinking")]
            # Every earlier round's thinking, first in its turn, as the API wrote it (signature included).
            assert [
                {k: v for k, v in b.items() if k != "cache_control"} for b in turn[: len(thinking)]
            ] == thinking
            assert turn[len(thinking)]["type"] == "tool_use"
    calls = run.completed_calls()
    assert all(c["reasoning_tokens"] > 0 for c in calls)
    assert all(c["output_tokens"] > c["reasoning_tokens"] for c in calls)
    events = run.events_of("LLM_CALL_COMPLETED")
    assert [e["reasoningTokens"] for e in events] == [c["reasoning_tokens"] for c in calls]
    # The stored round keeps the thinking text for the run page (never the redacted data as text).
    stored = json.loads(calls[0]["response"]["reasoning"][0]["data"])
    assert stored["thinking"] == "round 1: I will look it up"


async def test_responses_agent_sends_every_earlier_reasoning_item_and_a_fork_sends_the_same_bytes(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    ran = _register_lookup(harness)
    fake.responses.responder = reasoning_agent_responder("lookup", 3)
    step = llm_step(
        model="o4-mini",
        api="responses",
        reasoning={"effort": "medium"},
        tools=["lookup"],
        messages=[{"role": "user", "content": "look three things up"}],
    )
    run = await run_workflow(harness, workspace_id, step)
    assert run.status == "COMPLETED", run.run["error"]
    assert ran == [1, 2, 3] and run.state["agent"] == "done after 3 rounds"
    requests = [r.json for r in fake.responses.requests]
    assert len(requests) == 4 and not fake.openai.requests  # the Responses route only
    for index, body in enumerate(requests):
        assert body["store"] is False and body["reasoning"] == {"effort": "medium"}
        reasoning = [i for i in body["input"] if i.get("type") == "reasoning"]
        assert [i["summary"][0]["text"] for i in reasoning] == [
            f"round {n}: call lookup" for n in range(1, index + 1)
        ]
        # Each reasoning item directly before the call it was answered with.
        kinds = [i.get("type", "message") for i in body["input"]]
        assert kinds == ["message"] + ["reasoning", "function_call", "function_call_output"] * index
    calls = run.completed_calls()
    assert [c["reasoning_tokens"] for c in calls] == [7, 7, 7, 7]
    # Reasoning tokens are output tokens, priced with them: 5 of answer + 7 of reasoning.
    assert [c["output_tokens"] for c in calls] == [12, 12, 12, 12]
    priced = harness.rt.pricing.cost_usd("openai", "o4-mini", Usage(input_tokens=20, output_tokens=12))
    assert priced is not None and calls[0]["cost_usd"] == pytest.approx(priced)
    assert priced > harness.rt.pricing.cost_usd("openai", "o4-mini", Usage(input_tokens=20, output_tokens=5))
    assert run.events_of("LLM_CALL_COMPLETED")[0]["reasoningTokens"] == 7

    # A fork at round 3 inherits rounds 1-2 and sends their reasoning as the origin did.
    origin_round_3 = json.dumps(requests[2]["input"][:7])
    sent_before = len(fake.responses.requests)
    plan = await forking.plan_fork(harness.rt, workspace_id, run.id, {"step": "agent", "round": 3}, None)
    fork, _ = await forking.make(harness.rt, plan, None)
    row = await harness.wait_for_status(fork["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    forked = [r.json for r in fake.responses.requests[sent_before:]]
    assert len(forked) == 2  # rounds 3 and 4; rounds 1-2 were inherited, never sent again
    assert json.dumps(forked[0]["input"][:7]) == origin_round_3
    fork_run = await load_run(harness, fork["id"])
    inherited = [c for c in fork_run.llm_calls if c["inherited_from"] is not None]
    assert [c["response"]["reasoning"] for c in inherited] == [c["response"]["reasoning"] for c in calls[:2]]


async def test_a_responses_round_that_fails_over_to_anthropic_goes_on_without_the_reasoning_items(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    ran = _register_lookup(harness)
    fake.responses.enqueue(
        responses_tool_calls([("call_1", "lookup", '{"round": 1}')], reasoning="look first")
    )
    fake.enqueue(error(500, "upstream down"))
    fake.anthropic.enqueue(anthropic_text("found it"))
    step = llm_step(model="o4-mini", api="responses", fallbackModels=["claude-haiku-4-5"], tools=["lookup"])
    run = await run_workflow(harness, workspace_id, step)
    assert run.status == "COMPLETED", run.run["error"]
    assert ran == [1] and run.state["agent"] == "found it"
    assert [(c["model"], c["status"]) for c in run.llm_calls] == [
        ("o4-mini", "completed"),
        ("o4-mini", "failed"),
        ("claude-haiku-4-5", "completed"),
    ]
    # The reasoning item is OpenAI's: Anthropic gets the turn's tool call and result without it.
    sent = fake.anthropic.requests[0].json["messages"]
    assert [b["type"] for b in sent[1]["content"]] == ["tool_use"]
    assert "encrypted_content" not in json.dumps(sent)


@pytest.mark.parametrize("kind", ["responses", "anthropic"])
async def test_a_retried_step_resends_the_reasoning_of_its_inherited_rounds_byte_for_byte(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer, kind: str
) -> None:
    """Round 3 fails and the step is retried: the new attempt rebuilds the transcript from the rows,
    and its request is the one the first attempt sent, reasoning bytes included."""
    _register_lookup(harness)
    if kind == "responses":
        route, answer = fake.responses, reasoning_agent_responder("lookup", 3)
        step = llm_step(model="o4-mini", api="responses", tools=["lookup"])
    else:
        # A script without thinking: with thinking on, the fake thinks on every answer anyway.
        route = fake.anthropic

        def answer(body: dict[str, Any]) -> FakeResponse:
            done = sum(1 for m in body["messages"] if m["role"] == "assistant")
            if done >= 3:
                return anthropic_text("done")
            return anthropic_tool_use([(f"toolu_{done + 1}", "lookup", {"round": done + 1})])

        step = llm_step(model="claude-sonnet-4-5", tools=["lookup"], thinking={"budgetTokens": 1024})
    answered: list[int] = []

    def respond(body: dict[str, Any]) -> FakeResponse:
        answered.append(1)
        if len(answered) == 3:  # round 3 of attempt 1 fails: the step is retried from its rows
            return error(503, "overloaded")
        return answer(body)

    route.responder = respond
    run = await run_workflow(harness, workspace_id, {**step, "retry": {"maxAttempts": 2, "backoffMs": 100}})
    assert run.status == "COMPLETED", run.run["error"]
    assert len(run.step_runs) == 2
    bodies = [r.raw for r in route.requests]
    assert len(bodies) == 5  # rounds 1, 2, 3 (503), then 3 and 4 in attempt 2
    assert bodies[3] == bodies[2], "the retried round's request differs from the one before the failure"
    reasoning = b'"encrypted_content"' if kind == "responses" else b'"signature"'
    assert bodies[3].count(reasoning) == 2  # rounds 1 and 2 reasoned, and both went back
