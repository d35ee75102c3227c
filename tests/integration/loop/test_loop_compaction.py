"""The `compact` context strategy through the real SDKs against the fake servers: a recorded
summarising model call (`CONTEXT_COMPACTED`) whose summary replaces the older rounds in every
later request, valid tool-call pairing in each request, and a retried step that reads the summary
from its checkpoint (never asks for it again) and resends the same bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stevora.definitions import parse_definition
from stevora.errors import ValidationError
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    error,
    openai_text,
    openai_tool_calls,
)
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, load_run, run_workflow, tool_def
from tests.integration.loop.test_loop_prompt_cache import _register_bulky
from tests.integration.loop.test_time_travel import api  # noqa: F401  (the API client fixture)

SUMMARY = "SUMMARY: looked up t0..tN, each said detail; nothing left but to go on."
CONTEXT = {"maxInputTokens": 2_000, "strategy": "compact", "keepLastRounds": 1}


def is_compaction(body: dict[str, Any]) -> bool:
    """A compaction request: no tools, one user turn holding the conversation and the instruction."""
    last = body["messages"][-1]
    blocks = [last["content"]] if isinstance(last["content"], str) else last["content"]
    texts = [b if isinstance(b, str) else b.get("text") or "" for b in blocks]
    return not body.get("tools") and len(body["messages"]) == 1 and texts[0].startswith("<conversation>")


def _responder(kind: str, rounds: int, fail_at: int | None = None) -> Any:
    """One `lookup` per round for `rounds` rounds, then an answer; a compaction request gets the
    summary. Rounds are counted here: a compacted request holds fewer assistant turns."""
    answered: list[int] = []
    summaries: list[int] = []

    def respond(body: dict[str, Any]) -> Any:
        if is_compaction(body):  # numbered: a summary asked for again would differ
            summaries.append(1)
            text = f"{SUMMARY} #{len(summaries)}"
            return openai_text(text) if kind == "openai" else anthropic_text(text)
        answered.append(1)
        done = len(answered) - 1
        if fail_at is not None and len(answered) == fail_at:
            return error(503, "overloaded")
        if fail_at is not None and len(answered) > fail_at:
            done -= 1  # the failed request is asked again
        if done >= rounds:
            return (
                openai_text("All findings are in.")
                if kind == "openai"
                else anthropic_text("All findings are in.")
            )
        if kind == "openai":
            return openai_tool_calls([(f"call_{done}", "lookup", json.dumps({"topic": f"t{done}"}))])
        return anthropic_tool_use([(f"toolu_{done}", "lookup", {"topic": f"t{done}"})])

    return respond


def _agent(model: str, **fields: Any) -> dict[str, Any]:
    fields.setdefault("maxToolRounds", 12)
    fields.setdefault("systemPrompt", "Be brief.")
    fields.setdefault("context", CONTEXT)
    return llm_step(
        model=model, tools=[tool_def("lookup", {"topic": {"type": "string"}}, ["topic"])], **fields
    )


def _tool_pairs_valid(kind: str, body: dict[str, Any]) -> None:
    """Every tool call answered right after it, no result without its call (both providers)."""
    pending: set[str] = set()
    for m in body["messages"]:
        if kind == "openai":
            if m["role"] == "tool":
                assert m["tool_call_id"] in pending, body
                pending.discard(m["tool_call_id"])
                continue
            assert not pending, body
            pending = {c["id"] for c in m.get("tool_calls") or ()}
        else:
            blocks = m["content"] if isinstance(m["content"], list) else []
            for b in blocks:
                if b.get("type") == "tool_result":
                    assert b["tool_use_id"] in pending, body
                    pending.discard(b["tool_use_id"])
            assert not pending, body
            pending = {b["id"] for b in blocks if b.get("type") == "tool_use"}


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_compact_runs_past_a_window_its_full_transcript_would_exceed(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, model: str
) -> None:
    _register_bulky(harness)
    fake.context_window_tokens = 2_500
    route = fake.openai if model.startswith("gpt") else fake.anthropic
    route.responder = _responder(route.kind, 8)
    result = await run_workflow(harness, workspace_id, _agent(model))

    assert result.status == "COMPLETED", result.run["error"]
    bodies = [r.json for r in route.requests]
    compactions = [b for b in bodies if is_compaction(b)]
    events = result.events_of("CONTEXT_COMPACTED")
    assert len(compactions) == len(events) >= 2
    assert len(bodies) - len(compactions) == 9  # 8 tool rounds and the answer, every one accepted
    for body in bodies:
        _tool_pairs_valid(route.kind, body)
    for body in compactions:  # no tools offered; the older rounds as text, then the instruction
        text = json.dumps(body)
        assert "tool_choice" not in body and "Reply with the summary only." in text
    # Each event: what the request would have been, what it became, the rounds folded in.
    for e in events:
        assert e["tokensBefore"] > CONTEXT["maxInputTokens"] > e["tokensAfter"], e
        assert e["roundsCompacted"] >= 1 and e["compactedThrough"] >= e["roundsCompacted"]
    assert sum(e["roundsCompacted"] for e in events) == events[-1]["compactedThrough"]
    # The summary replaces the older rounds in every later request.
    after = json.dumps(bodies[-1])
    assert SUMMARY in after and after.count(": detail ") <= 2
    # The compaction is a recorded model call of its own, numbered as a round.
    rows = result.completed_calls()
    marked = [c for c in rows if "compaction" in c["request"]]
    assert [c["id"] for c in marked] == [e["llmCallId"] for e in events]
    assert [c["round"] for c in marked] == [e["round"] for e in events]
    assert [c["response"]["text"] for c in marked] == [f"{SUMMARY} #{n + 1}" for n in range(len(marked))]
    assert len({c["round"] for c in rows}) == len(rows)
    # The step's output counts the loop's rounds, not the compactions.
    assert result.state["agent"] == "All findings are in."
    # The later rounds' events say which rounds went out as the summary.
    through = [e.get("contextCompactedThrough") for e in result.events_of("LLM_CALL_COMPLETED")]
    assert through[0] is None and through[-1] == events[-1]["compactedThrough"]


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_a_retried_step_reads_the_summary_from_its_checkpoint_and_resends_the_same_bytes(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, model: str
) -> None:
    _register_bulky(harness)
    fake.context_window_tokens = 2_500  # the fakes count the prompt's tokens (and refuse more)
    route = fake.openai if model.startswith("gpt") else fake.anthropic
    # The 6th loop request (after the first compaction) fails: the step's second attempt
    # rebuilds its transcript from the rows, the compaction included.
    route.responder = _responder(route.kind, 6, fail_at=6)
    step = _agent(model, retry={"maxAttempts": 2, "backoffMs": 100})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert len(result.step_runs) == 2
    bodies = [r.raw for r in route.requests]
    loop = [b for b in bodies if not is_compaction(json.loads(b))]
    failed_index = 5
    before, again = loop[failed_index], loop[failed_index + 1]
    assert SUMMARY.encode() in before
    assert again == before, "the retried round's request differs from the one before the failure"
    # Compacted once per decision: the retry read the summary, it did not ask for it again.
    compactions = len(bodies) - len(loop)
    assert compactions == len(result.events_of("CONTEXT_COMPACTED")) >= 1


def test_context_model_and_strategy_are_validated_naming_the_field() -> None:
    base = {"name": "a", "version": "1"}
    ok = parse_definition({**base, "steps": [llm_step(context={**CONTEXT, "model": "gpt-4o"})]})
    assert ok.steps[0].context.model == "gpt-4o"  # type: ignore[union-attr]
    for context, field in [
        ({**CONTEXT, "strategy": "squash"}, "steps[0].context.strategy"),
        ({"maxInputTokens": 5000, "model": "gpt-4o"}, "steps[0].context"),
        ({**CONTEXT, "model": ""}, "steps[0].context.model"),
    ]:
        with pytest.raises(ValidationError) as caught:
            parse_definition({**base, "steps": [llm_step(context=context)]})
        paths = [e["path"] for e in caught.value.details["errors"]]
        assert field in paths, (paths, caught.value.details)


def _stateless_responder(rounds: int) -> Any:
    """OpenAI: the round from the request itself (the highest `call_N` answered, plus one), so an
    origin and its forks are answered alike; a compaction request gets a numbered summary."""
    summaries: list[int] = []

    def respond(body: dict[str, Any]) -> Any:
        if is_compaction(body):
            summaries.append(1)
            return openai_text(f"{SUMMARY} #{len(summaries)}")
        answered = [int(m["tool_call_id"][5:]) for m in body["messages"] if m["role"] == "tool"]
        done = max(answered) + 1 if answered else 0
        if done >= rounds:
            return openai_text("All findings are in.")
        return openai_tool_calls([(f"call_{done}", "lookup", json.dumps({"topic": f"t{done}"}))])

    return respond


async def test_a_fork_starts_before_or_after_a_compaction(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    api: Any,  # noqa: F811  (the fixture imported above)
) -> None:
    """At the compaction's round: the fork compacts again. At the next: it inherits the summary
    and its first request is the origin's request for that round, byte for byte."""
    client, headers = api
    _register_bulky(harness)
    fake.context_window_tokens = 2_500
    fake.openai.responder = _stateless_responder(6)
    definition = {"name": "compacting", "steps": [_agent("gpt-4o-mini")]}
    created = await client.post(
        "/v1/workflow-runs", json={"definition": definition, "input": {"question": "go"}}, headers=headers
    )
    assert created.status_code == 201, created.text
    origin_id = created.json()["data"]["id"]
    row = await harness.wait_for_status(origin_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    origin_bodies = [r.raw for r in fake.openai.requests]
    first = next(i for i, b in enumerate(origin_bodies) if is_compaction(json.loads(b)))
    compaction_round = (await load_run(harness, origin_id)).events_of("CONTEXT_COMPACTED")[0]["round"]
    # Its fork points: the compaction is one (before it), the round after it another.
    points = (await client.get(f"/v1/workflow-runs/{origin_id}/checkpoints", headers=headers)).json()["data"]
    ats = [p["at"] for p in points]
    assert f"agent:{compaction_round}" in ats and f"agent:{compaction_round + 1}" in ats

    async def fork(at_round: int) -> tuple[str, list[bytes]]:
        sent = len(fake.openai.requests)
        made = await client.post(
            f"/v1/workflow-runs/{origin_id}/fork",
            json={"at": {"step": "agent", "round": at_round}},
            headers=headers,
        )
        assert made.status_code == 201, made.text
        fork_id = made.json()["data"]["id"]
        done = await harness.wait_for_status(fork_id, "COMPLETED", "FAILED")
        assert done["status"] == "COMPLETED", done["error"]
        return fork_id, [r.raw for r in fake.openai.requests[sent:]]

    # After it: the summary is inherited, not asked for again; the first request is the origin's.
    after_id, after = await fork(compaction_round + 1)
    # (Byte for byte but for the prompt cache key: each run's own id.)
    assert after[0].replace(after_id.encode(), origin_id.encode()) == origin_bodies[first + 1]
    assert SUMMARY.encode() + b" #1" in after[0]
    inherited = [c for c in (await load_run(harness, after_id)).llm_calls if c["inherited_from"]]
    assert any("compaction" in c["request"] for c in inherited)
    listed = (await client.get(f"/v1/workflow-runs/{after_id}/llm-calls", headers=headers)).json()["data"]
    by_id = {c["id"]: c["kind"] for c in listed}
    assert all(
        by_id[c["id"]] == ("compaction" if "compaction" in c["request"] else "round") for c in inherited
    )
    # Before it: the fork's first call is the compaction again (a new summary), then its round.
    before_id, before = await fork(compaction_round)
    assert is_compaction(json.loads(before[0]))
    assert before[0].replace(before_id.encode(), origin_id.encode()) == origin_bodies[first]
    assert SUMMARY.encode() + b" #1" not in before[1] and SUMMARY.encode() in before[1]
    before_run = await load_run(harness, before_id)
    assert before_run.events_of("CONTEXT_COMPACTED")[0]["round"] == compaction_round


async def test_a_failed_summary_call_is_recorded_and_the_retried_step_compacts_then(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    _register_bulky(harness)
    fake.context_window_tokens = 2_500
    inner = _stateless_responder(6)
    failed: list[int] = []

    def respond(body: dict[str, Any]) -> Any:
        if is_compaction(body) and not failed:
            failed.append(1)
            return error(503, "overloaded")
        return inner(body)

    fake.openai.responder = respond
    step = _agent("gpt-4o-mini", retry={"maxAttempts": 2, "backoffMs": 100})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert len(result.step_runs) == 2
    failures = result.events_of("LLM_CALL_FAILED")
    assert [f["kind"] for f in failures] == ["compaction"]
    failed_row = next(c for c in result.llm_calls if c["status"] == "failed")
    assert "compaction" in failed_row["request"] and failed_row["round"] == failures[0]["round"]
    # The retry compacted at the same point (the same round number, now completed).
    compacted = result.events_of("CONTEXT_COMPACTED")
    assert compacted[0]["round"] == failures[0]["round"]


async def test_context_model_writes_the_summary(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """The step talks to OpenAI; its summaries are written by the Anthropic model it names."""
    _register_bulky(harness)
    fake.context_window_tokens = 2_500
    fake.openai.responder = _stateless_responder(6)
    fake.anthropic.responder = lambda body: anthropic_text(f"{SUMMARY} (haiku)")
    step = _agent("gpt-4o-mini", context={**CONTEXT, "model": "claude-haiku-4-5"})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    summaries = [r.json for r in fake.anthropic.requests]
    assert summaries and all(is_compaction(b) and "tools" not in b for b in summaries)
    assert not any(is_compaction(r.json) for r in fake.openai.requests)
    events = result.events_of("CONTEXT_COMPACTED")
    assert len(events) == len(summaries) and {e["model"] for e in events} == {"claude-haiku-4-5"}
    assert f"{SUMMARY} (haiku)" in json.dumps(fake.openai.requests[-1].json)
