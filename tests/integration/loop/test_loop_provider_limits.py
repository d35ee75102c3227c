"""Provider rate limits shared by every worker (STEVORA_RATE_LIMITS), in one process: calls wait for
their turn instead of drawing a 429, the estimate is corrected from the usage, a provider 429
shrinks the budget, a fallback model is tried when the turn is too far away, and nothing changes
for a model without a limit. Across worker processes: tests/e2e/test_provider_limits_processes.py."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from stevora.db import provider_limits as db
from stevora.engine import commands, provider_limits
from stevora.engine.provider_limits import ProviderLimits
from stevora.errors import ProviderError
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.messages import LlmRequest, LlmResponse, Message
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.provider import Provider
from stevora.observability import metrics
from stevora.settings import ProviderRateLimit
from stevora.testing.fake_llm import FakeLLMServer, anthropic_text, error, openai_text
from stevora.testing.fake_rate_limit import FakeRateLimit
from tests.conftest import Harness, create_definition
from tests.integration.loop.conftest import LoopRun, SdkProviders, llm_step, load_run


def _model() -> str:
    return f"gpt-limited-{secrets.token_hex(4)}"  # a bucket of its own (the table outlives a test)


def _limit(harness: Harness, limits: dict[str, dict[str, int]], **settings: Any) -> None:
    """Configure STEVORA_RATE_LIMITS (and friends) on the harness's runtime."""
    harness.rt.settings = harness.rt.settings.model_copy(
        update={"rate_limits": {k: ProviderRateLimit(**v) for k, v in limits.items()}, **settings}
    )


async def _runs(harness: Harness, workspace_id: str, step: dict[str, Any], n: int) -> list[LoopRun]:
    """`n` runs of one definition of `step`, one after the other."""
    def_id = await create_definition(
        harness.rt, workspace_id, {"name": _model(), "version": "1", "steps": [step]}
    )
    done = []
    for _ in range(n):
        run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "q"})
        await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=30)
        done.append(await load_run(harness, run["id"]))
    return done


async def _run_many(harness: Harness, workspace_id: str, steps: dict[str, Any], n: int) -> list[str]:
    def_id = await create_definition(
        harness.rt, workspace_id, {"name": "limited", "version": "1", "steps": [steps]}
    )
    ids = [
        (await commands.create_run(harness.rt, workspace_id, def_id, {"question": f"q{i}"}))[0]["id"]
        for i in range(n)
    ]
    for run_id in ids:
        row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)
        assert row["status"] == "COMPLETED", row["error"]
    return ids


async def test_calls_beyond_the_budget_wait_for_their_turn_instead_of_drawing_429s(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    model = _model()
    fake.responder = lambda _body: openai_text("ok", model=model)
    # One request a second after a burst of five (the fake's) or 4.5 (ours: the rest of the
    # window covers calls granted but still on their way).
    fake.rate_limit = FakeRateLimit(requests=5, tokens=1_000_000, window_s=5.0)
    _limit(harness, {f"openai:{model}": {"rpm": 5}}, rate_limit_window_s=5.0)
    ids = await _run_many(harness, workspace_id, llm_step(model=model), 8)
    assert fake.rate_limit.refused == 0 and fake.rate_limit.served == 8
    log = fake.rate_limit.log
    assert log[-1].at - log[0].at >= 2.5  # four calls beyond the burst, a second apart
    waits = []
    for run_id in ids:
        run = await load_run(harness, run_id)
        (done,) = run.events_of("LLM_CALL_COMPLETED")
        waits.append(done["rateLimitWaitMs"])
    assert max(waits) >= 900 and min(waits) < 100
    text = metrics.exposition()[0].decode()
    assert 'stevora_llm_rate_limit_wait_seconds_count{model="other",outcome="sent",provider="openai"}' in text


async def test_without_the_limiter_the_same_burst_draws_429s(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    """The control of the test above: what the fake answers when nobody waits."""
    model = _model()
    fake.responder = lambda _body: openai_text("ok", model=model)
    fake.rate_limit = FakeRateLimit(requests=3, tokens=1_000_000, window_s=1.0)
    def_id = await create_definition(
        harness.rt, workspace_id, {"name": "unlimited", "version": "1", "steps": [llm_step(model=model)]}
    )
    ids = [
        (await commands.create_run(harness.rt, workspace_id, def_id, {"question": "q"}))[0]["id"]
        for _ in range(8)
    ]
    for run_id in ids:  # answered at once, or after 429s and step retries, or failed
        await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)
    assert fake.rate_limit.refused > 0


async def test_the_usage_of_an_answer_corrects_the_estimate_at_the_next_reservation(harness: Harness) -> None:
    key = f"test:{_model()}"
    limits = ProviderLimits(harness.rt.pool, {key: ProviderRateLimit(tpm=1000)}, window_s=60)
    budget = limits.budgets[key]  # 900 tokens (BURST), 16.7 per second
    first = await limits.reserve(budget, 900, 60)
    assert first.granted and first.wait_s == 0
    # Without a correction, 300 more tokens would be 18 s away.
    late = await limits.reserve(budget, 300, 0)
    assert not late.granted and late.wait_s > 15
    limits.answered(budget, reserved=900, used=100)  # the answer used 100: 800 given back
    again = await limits.reserve(budget, 300, 0)
    assert again.granted and again.wait_s == 0


async def test_a_provider_429_shrinks_the_budget_and_empties_it_for_its_retry_after(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    model = _model()
    limits = ProviderLimits(harness.rt.pool, {f"openai:{model}": ProviderRateLimit(rpm=600)}, window_s=60)
    provider = limits.wrap(sdk.openai(), model, fallback=False)
    fake.enqueue(
        error(429, "slow down", retry_after_s=3, headers={"x-ratelimit-remaining-requests": "0"}),
        openai_text("ok", model=model),
    )
    request = LlmRequest(model=model, messages=[Message(role="user", content="hi")])
    with pytest.raises(ProviderError) as refused:
        await provider.complete(request)
    assert refused.value.status_code == 429 and refused.value.remaining == (0.0, None)
    (bucket,) = await db.snapshot(harness.rt.pool, [f"openai:{model}"])
    assert bucket.scale == pytest.approx(0.8)
    # 540 requests of headroom before the 429; after it nobody may send for its 3 s.
    turn = await limits.reserve(limits.budgets[f"openai:{model}"], 1, 0)
    assert not turn.granted and turn.wait_s > 2.5


def _own_client_provider(fake: FakeLLMServer, kind: str) -> Provider:
    """A provider as `build_router` makes it (our HTTP client and its hooks), SDK retries on."""
    if kind == "openai":
        return OpenAIProvider("test", fake.openai_base_url, max_retries=2, timeout_s=10)
    return AnthropicProvider("test", fake.anthropic_base_url, max_retries=2, timeout_s=10)


HI = [Message(role="user", content="hi")]


async def _call(
    fake: FakeLLMServer, kind: str, model: str, limits: ProviderLimits | None = None
) -> LlmResponse:
    """One call of `model` through a provider of our own client (under `limits` when given)."""
    inner = _own_client_provider(fake, kind)
    provider = limits.wrap(inner, model, fallback=False) if limits is not None else inner
    try:
        return await provider.complete(LlmRequest(model=model, messages=HI, max_tokens=16))
    finally:
        await inner.aclose()


def _limits(harness: Harness, model: str, *, resends: int) -> ProviderLimits:
    return ProviderLimits(
        harness.rt.pool, {model: ProviderRateLimit(rpm=6000)}, window_s=60, resends_after_429=resends
    )


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_429_under_a_shared_limit_is_sent_again_through_the_budget_not_by_the_sdk(
    harness: Harness, fake: FakeLLMServer, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request the provider gets went through the shared budget: the SDK's own resending of
    a 429 (unseen by every other worker's budget) is off under a limit, and the limiter sends
    again at the next turn, after the 429 lowered the budget."""
    model = _model()
    limits = _limits(harness, model, resends=2)
    reservations = 0
    real_reserve = limits.reserve

    async def counted(*args: Any) -> Any:
        nonlocal reservations
        reservations += 1
        return await real_reserve(*args)

    monkeypatch.setattr(limits, "reserve", counted)
    script = fake.openai if kind == "openai" else fake.anthropic
    answer = openai_text("ok", model=model) if kind == "openai" else anthropic_text("ok", model=model)
    script.enqueue(error(429, "slow down", retry_after_ms=200), answer)
    response = await _call(fake, kind, model, limits)
    assert response.text == "ok"
    assert len(script.requests) == 2 and reservations == 2  # each request had its turn
    # The answer's usage corrects the estimate at this process's next reservation.
    request_tokens = provider_limits.estimate_tokens(LlmRequest(model=model, messages=HI, max_tokens=16))
    used = response.usage.input_tokens + response.usage.output_tokens
    assert used > 0 and limits._given_back == {model: float(request_tokens - used)}
    (bucket,) = await db.snapshot(harness.rt.pool, [model])
    # The 429 lowered the shared budget at once; the resend's reservation gave back its share.
    assert bucket.scale == pytest.approx(provider_limits.SHRINK + provider_limits.RECOVER)


async def test_a_call_refused_again_and_again_is_resent_at_most_the_configured_times(
    harness: Harness, fake: FakeLLMServer
) -> None:
    model = _model()
    fake.openai.enqueue(*[error(429, "slow down", retry_after_ms=10)] * 3, openai_text("ok", model=model))
    with pytest.raises(ProviderError) as refused:
        await _call(fake, "openai", model, _limits(harness, model, resends=1))
    assert refused.value.status_code == 429 and refused.value.retryable is True  # the step retries it
    assert len(fake.openai.requests) == 2  # sent, then resent once


async def test_without_a_shared_limit_the_sdk_still_resends_a_429_itself(fake: FakeLLMServer) -> None:
    fake.openai.enqueue(error(429, "slow down", retry_after_ms=50), openai_text("ok"))
    response = await _call(fake, "openai", "gpt-4o-mini")
    assert response.text == "ok" and len(fake.openai.requests) == 2


async def test_a_429_the_provider_says_not_to_retry_is_not_sent_again(
    harness: Harness, fake: FakeLLMServer
) -> None:
    """OpenAI's `insufficient_quota` 429 (`x-should-retry: false` from the server) stays final."""
    model = _model()
    fake.openai.enqueue(
        # The marker the limiter's hook sets is dropped when a server sends it.
        error(429, "quota", should_retry=False, headers={"x-stevora-left-to-limiter": "1"}),
        openai_text("ok", model=model),
    )
    with pytest.raises(ProviderError) as refused:
        await _call(fake, "openai", model, _limits(harness, model, resends=2))
    assert refused.value.status_code == 429 and refused.value.retryable is False
    assert len(fake.openai.requests) == 1


async def test_a_fallback_model_is_tried_when_the_primary_turn_is_too_far_away(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    primary, backup = _model(), _model()
    fake.responder = lambda body: openai_text("ok", model=body["model"])
    _limit(harness, {f"openai:{primary}": {"rpm": 1}, backup: {"rpm": 100}}, rate_limit_fallback_after_s=1.0)
    step = llm_step(model=primary, fallbackModels=[backup])
    first, second = await _runs(harness, workspace_id, step, 2)
    assert first.status == second.status == "COMPLETED"
    assert [r.json["model"] for r in fake.openai.requests] == [primary, backup]  # the primary was not sent
    (skipped,) = second.events_of("LLM_CALL_FAILED")
    assert skipped["model"] == primary and skipped["error"]["code"] == "RATE_LIMITED"
    assert skipped["error"]["details"]["retryAfterSeconds"] > 50  # one request a minute
    (done,) = second.events_of("LLM_CALL_COMPLETED")
    assert done["model"] == backup and "rateLimitWaitMs" in done


async def test_a_turn_beyond_the_longest_wait_is_retried_at_its_turn_without_spending_an_attempt(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    model = _model()
    fake.responder = lambda _body: openai_text("ok", model=model)
    _limit(harness, {f"openai:{model}": {"rpm": 1}}, rate_limit_window_s=2.0, rate_limit_max_wait_s=0.5)
    # No retries in the policy: an attempt that sent nothing does not spend one.
    step = llm_step(model=model, retry={"maxAttempts": 1, "backoffMs": 100})
    _, second = await _runs(harness, workspace_id, step, 2)
    assert second.status == "COMPLETED"
    (retrying,) = second.events_of("STEP_RETRYING")
    assert (
        retrying["error"]["code"] == "RATE_LIMITED" and retrying["delayMs"] >= 1000
    )  # not the 100 ms backoff
    assert len(fake.openai.requests) == 2  # nothing was sent for the refused attempt
    text = metrics.exposition()[0].decode()
    assert (
        'stevora_llm_rate_limit_wait_seconds_count{model="other",outcome="refused",provider="openai"}' in text
    )


async def test_a_step_deferred_max_deferrals_times_fails_instead_of_waiting_for_ever(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    model = _model()
    fake.responder = lambda _body: openai_text("ok", model=model)
    _limit(
        harness,
        {f"openai:{model}": {"rpm": 1}},
        rate_limit_window_s=60.0,
        rate_limit_max_wait_s=0.5,
        rate_limit_max_deferrals=1,
    )
    _, second = await _runs(harness, workspace_id, llm_step(model=model), 2)
    assert second.status == "FAILED"
    error = second.run["error"]
    assert error["code"] == "RATE_LIMITED" and error["retryable"] is False
    assert "deferred this step 1 times" in error["message"] and "MAX_DEFERRALS=1" in error["message"]
    assert error["message"].endswith("; not sent")  # the last deferral's own message follows
    assert second.events_of("STEP_RETRYING") == []
    assert len(fake.openai.requests) == 1  # the second run sent nothing


async def test_a_model_without_a_limit_is_called_as_before(
    harness: Harness, workspace_id: str, sdk: SdkProviders, fake: FakeLLMServer
) -> None:
    model = _model()
    fake.responder = lambda _body: openai_text("ok", model=model)
    (run,) = await _runs(harness, workspace_id, llm_step(model=model), 1)
    assert run.status == "COMPLETED"
    (done,) = run.events_of("LLM_CALL_COMPLETED")
    assert "rateLimitWaitMs" not in done
    assert harness.rt.provider_limits is None  # unconfigured: never even built
    # Configured for another model: this one's provider is not wrapped and has no bucket.
    _limit(harness, {"openai:some-other-model": {"rpm": 5}})
    (run,) = await _runs(harness, workspace_id, llm_step(model=model), 1)
    (done,) = run.events_of("LLM_CALL_COMPLETED")
    assert "rateLimitWaitMs" not in done
    provider = sdk.openai(name="openai")
    assert provider_limits.of(harness.rt).wrap(provider, model, fallback=False) is provider
    assert await db.snapshot(harness.rt.pool, [f"openai:{model}"]) == []
