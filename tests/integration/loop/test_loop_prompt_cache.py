"""Long-horizon agents: prompt caching through the real SDKs against the caching fake, byte-stable
transcripts across a step retry (the transcript rebuilt from the rows), and the round ceiling."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stevora.engine.limits import check_definition
from stevora.errors import ValidationError
from stevora.settings import Settings
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    error,
    openai_text,
    openai_tool_calls,
)
from stevora.testing.fake_prompt_cache import FakePromptCache, without_cache_markers
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow, tool_def

# A system prompt long enough for both providers' minimum cacheable prefix (1,024 tokens).
LONG_SYSTEM = "You are a meticulous research agent. " + " ".join(
    f"Rule {n}: cite the source of every claim and prefer primary documents." for n in range(120)
)
ROUNDS = 6


def _register_lookup(harness: Harness) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    async def lookup(input: dict[str, Any]) -> dict[str, Any]:
        calls.append(input)
        # Keys in an order jsonb would not keep (it sorts shorter keys first), a float jsonb
        # would write as an integer, nested objects: the bytes a rebuilt transcript must repeat.
        return {"zeta_summary": f"finding {len(calls)}", "a": {"yy": 2, "b": 1}, "big": 1e16, "n": len(calls)}

    harness.tools.register("lookup", lookup)
    return calls


def _agent(model: str, **fields: Any) -> dict[str, Any]:
    fields.setdefault("maxToolRounds", ROUNDS + 2)
    fields.setdefault("systemPrompt", LONG_SYSTEM)
    return llm_step(
        model=model,
        tools=[tool_def("lookup", {"topic": {"type": "string"}}, ["topic"])],
        **fields,
    )


def _tool_rounds_then_answer(kind: str, rounds: int) -> Any:
    """A responder that calls `lookup` once per round for `rounds` rounds, then answers."""

    def respond(body: dict[str, Any]) -> Any:
        done = sum(1 for m in body.get("messages") or () if m.get("role") == "assistant")
        if kind == "openai":
            if done >= rounds:
                return openai_text("All findings are in.")
            return openai_tool_calls([(f"call_{done}", "lookup", json.dumps({"topic": f"t{done}"}))])
        if done >= rounds:
            return anthropic_text("All findings are in.")
        return anthropic_tool_use([(f"toolu_{done}", "lookup", {"topic": f"t{done}"})])

    return respond


def _cache_markers(body: dict[str, Any]) -> int:
    text = json.dumps(body)
    return text.count('"cache_control"')


async def test_anthropic_rounds_read_the_earlier_rounds_from_the_cache(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    _register_lookup(harness)
    fake.prompt_cache = cache = FakePromptCache()
    fake.anthropic.responder = _tool_rounds_then_answer("anthropic", ROUNDS)
    result = await run_workflow(harness, workspace_id, _agent("claude-haiku-4-5"))

    assert result.status == "COMPLETED", result.run["error"]
    bodies = [r.json for r in fake.anthropic.requests]
    assert len(bodies) == ROUNDS + 1
    for body in bodies:
        # Within the provider's limit of four: tools, system, the previous round's end, this end.
        assert 1 <= _cache_markers(body) <= 4, body
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert "cache_control" in body["messages"][-1]["content"][-1]
    shares = [entry.read_tokens / entry.prompt_tokens for entry in cache.log]
    assert shares[0] == 0  # nothing cached yet: the first request writes
    assert cache.log[0].write_tokens > 0
    assert all(share >= 0.9 for share in shares[2:]), shares
    # The call rows and their events carry the cache reads and writes separately.
    rows = result.completed_calls()
    assert [c["cache_read_tokens"] for c in rows] == [e.read_tokens for e in cache.log]
    assert [c["cache_write_tokens"] for c in rows] == [e.write_tokens for e in cache.log]
    events = result.events_of("LLM_CALL_COMPLETED")
    assert [e["cacheReadTokens"] for e in events] == [e.read_tokens for e in cache.log]
    assert [e["cacheWriteTokens"] for e in events] == [e.write_tokens for e in cache.log]
    # Every prompt token is counted once: reads + writes + the uncached rest.
    assert [c["input_tokens"] for c in rows] == [e.prompt_tokens for e in cache.log]


async def test_openai_requests_share_the_runs_prompt_cache_key_and_read_the_prefix(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    _register_lookup(harness)
    fake.prompt_cache = cache = FakePromptCache()
    fake.openai.responder = _tool_rounds_then_answer("openai", ROUNDS)
    result = await run_workflow(harness, workspace_id, _agent("gpt-4o-mini"))

    assert result.status == "COMPLETED", result.run["error"]
    keys = {r.json.get("prompt_cache_key") for r in fake.openai.requests}
    assert keys == {result.id}
    shares = [entry.read_tokens / entry.prompt_tokens for entry in cache.log]
    assert shares[0] == 0
    assert all(share >= 0.9 for share in shares[2:]), shares
    rows = result.completed_calls()
    assert [c["cache_read_tokens"] for c in rows] == [e.read_tokens for e in cache.log]


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_a_step_with_cache_false_sends_no_cache_hints(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, model: str
) -> None:
    _register_lookup(harness)
    route = fake.openai if model.startswith("gpt") else fake.anthropic
    route.responder = _tool_rounds_then_answer(route.kind, 2)
    result = await run_workflow(harness, workspace_id, _agent(model, cache=False))
    assert result.status == "COMPLETED", result.run["error"]
    assert len(route.requests) == 3
    for request in route.requests:
        assert _cache_markers(request.json) == 0
        assert "prompt_cache_key" not in request.json
        if route.kind == "anthropic":
            assert isinstance(request.json["system"], str)


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_a_retried_step_resends_the_inherited_rounds_byte_for_byte(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, model: str
) -> None:
    """The transcript a new attempt rebuilds from the rows is the one the first attempt sent."""
    _register_lookup(harness)
    route = fake.openai if model.startswith("gpt") else fake.anthropic
    responder = _tool_rounds_then_answer(route.kind, 2)
    answered: list[int] = []

    def respond(body: dict[str, Any]) -> Any:
        answered.append(1)
        if len(answered) == 3:  # round 3 of attempt 1 fails: the step is retried from its rows
            return error(503, "overloaded")
        return responder(body)

    route.responder = respond
    step = _agent(model, retry={"maxAttempts": 2, "backoffMs": 100})
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert len(result.step_runs) == 2
    bodies = [r.raw for r in route.requests]
    assert len(bodies) == 4  # round 1, round 2, round 3 (503), round 3 again in attempt 2
    before, after = bodies[2], bodies[3]
    assert after == before, "the retried round's request differs from the one before the failure"
    # And the inherited rounds are the prefix the previous requests sent (cache markers aside).
    second = without_cache_markers(json.loads(bodies[1]))
    fourth = without_cache_markers(json.loads(after))
    assert fourth["messages"][: len(second["messages"])] == second["messages"]


def test_max_tool_rounds_above_the_servers_ceiling_is_refused_naming_the_field() -> None:
    settings = Settings(max_tool_rounds=300)
    ok = {"name": "a", "version": "1", "steps": [llm_step(maxToolRounds=300)]}
    check_definition(settings, ok, "body")
    over = {
        "name": "a",
        "version": "1",
        "steps": [{"type": "task", "name": "t"}, llm_step(maxToolRounds=301)],
    }
    with pytest.raises(ValidationError) as caught:
        check_definition(settings, over, "definition")
    assert caught.value.details == {
        "errors": [
            {
                "path": "definition.steps[1].maxToolRounds",
                "message": "301 is above this server's ceiling of 300 rounds (STEVORA_MAX_TOOL_ROUNDS)",
            }
        ]
    }


async def test_a_five_hundred_round_step_is_accepted_by_default(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.openai.enqueue(openai_tool_calls([("c1", "lookup", '{"topic": "x"}')]), openai_text("done"))
    _register_lookup(harness)
    check_definition(Settings(), {"steps": [llm_step(maxToolRounds=500)]}, "body")
    result = await run_workflow(harness, workspace_id, _agent("gpt-4o-mini", maxToolRounds=500))
    assert result.status == "COMPLETED", result.run["error"]


def _register_bulky(harness: Harness) -> None:
    async def lookup(input: dict[str, Any]) -> dict[str, Any]:
        return {"topic": input["topic"], "text": f"{input['topic']}: " + "detail " * 400}

    harness.tools.register("lookup", lookup)


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_a_step_without_context_over_the_window_fails_with_context_too_long(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, model: str
) -> None:
    _register_bulky(harness)
    fake.context_window_tokens = 2_500
    route = fake.openai if model.startswith("gpt") else fake.anthropic
    route.responder = _tool_rounds_then_answer(route.kind, 8)
    result = await run_workflow(harness, workspace_id, _agent(model, systemPrompt="Be brief."))

    assert result.status == "FAILED"
    error_ = result.run["error"]
    assert error_["code"] == "CONTEXT_TOO_LONG", error_
    assert error_["retryable"] is False
    assert "over the model's 2500" in error_["message"]
    assert error_["details"]["maxInputTokens"] == 2_500 and error_["details"]["inputTokens"] > 2_500


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_trim_tool_results_runs_past_a_window_its_full_transcript_would_exceed(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, model: str
) -> None:
    _register_bulky(harness)
    fake.context_window_tokens = 2_500
    route = fake.openai if model.startswith("gpt") else fake.anthropic
    route.responder = _tool_rounds_then_answer(route.kind, 8)
    context = {"maxInputTokens": 2_000, "strategy": "trim_tool_results", "keepLastRounds": 1}
    step = _agent(model, systemPrompt="Be brief.", context=context, maxToolRounds=10)
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert len(route.requests) == 9  # every request was valid (the fake checks each call's pairing)
    last = json.dumps(route.requests[-1].json)
    assert last.count('trimmed\\":true') >= 6  # the older results went out as stubs
    assert 1 <= last.count(": detail ") <= 3  # only the latest rounds' results went out whole
    trimmed_events = [e.get("contextTrimmedThrough") for e in result.events_of("LLM_CALL_COMPLETED")]
    assert trimmed_events[0] is None and trimmed_events[-1] >= 6
    # What was trimmed is stored with the call: a rebuild trims exactly the same rounds.
    stored = [c["request"].get("contextTrimmedThrough") for c in result.completed_calls()]
    assert stored == trimmed_events
