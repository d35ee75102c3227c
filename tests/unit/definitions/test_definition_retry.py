from __future__ import annotations

import pytest
from pydantic import ValidationError as PydanticValidationError

from stevora.definitions import (
    DEFAULT_RETRY_POLICY,
    ApprovalStep,
    RetryPolicy,
    TaskStep,
    compute_next_retry_delay_ms,
    parse_definition,
)


def test_retry_policy_defaults_match_the_documented_policy() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.backoff_ms, policy.backoff_multiplier, policy.max_backoff_ms) == (
        3,
        1000,
        2.0,
        300_000,
    )
    assert policy == DEFAULT_RETRY_POLICY


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("maxAttempts", 0),
        ("maxAttempts", 21),
        ("backoffMs", 99),
        ("backoffMultiplier", 0.5),
        ("backoffMultiplier", 10.5),
        ("maxBackoffMs", 99),
    ],
)
def test_retry_policy_rejects_values_outside_documented_limits(field: str, value: float) -> None:
    with pytest.raises(PydanticValidationError) as info:
        RetryPolicy.model_validate({field: value})
    assert info.value.errors()[0]["loc"] == (field,)


def test_max_backoff_below_backoff_is_accepted_and_caps_the_first_delay() -> None:
    policy = RetryPolicy(backoff_ms=5000, max_backoff_ms=1000)
    assert compute_next_retry_delay_ms(policy, 1, rand=lambda: 0.5) == 1000


def test_delay_grows_exponentially_with_the_failed_attempt_number() -> None:
    policy = RetryPolicy(backoff_ms=1000, backoff_multiplier=2)
    delays = [compute_next_retry_delay_ms(policy, attempt, rand=lambda: 0.5) for attempt in (1, 2, 3, 4)]
    assert delays == [1000, 2000, 4000, 8000]


def test_jitter_spans_eighty_to_one_hundred_twenty_percent_of_the_base() -> None:
    policy = RetryPolicy(backoff_ms=1000, backoff_multiplier=3)
    assert compute_next_retry_delay_ms(policy, 2, rand=lambda: 0.0) == 2400
    assert compute_next_retry_delay_ms(policy, 2, rand=lambda: 0.25) == 2700
    assert compute_next_retry_delay_ms(policy, 2, rand=lambda: 1.0) == 3600


def test_random_delays_stay_within_jitter_bounds() -> None:
    policy = RetryPolicy(backoff_ms=1000, backoff_multiplier=2)
    delays = {compute_next_retry_delay_ms(policy, 3) for _ in range(500)}
    assert min(delays) >= 3200
    assert max(delays) <= 4800
    assert len(delays) > 1


def test_delay_never_exceeds_max_backoff_even_with_upward_jitter() -> None:
    policy = RetryPolicy(backoff_ms=1000, backoff_multiplier=10, max_backoff_ms=50_000)
    assert compute_next_retry_delay_ms(policy, 5, rand=lambda: 0.999) == 50_000
    assert compute_next_retry_delay_ms(policy, 5, rand=lambda: 0.0) == 40_000


def test_huge_attempt_numbers_are_capped_instead_of_overflowing() -> None:
    policy = RetryPolicy(backoff_multiplier=10)
    assert compute_next_retry_delay_ms(policy, 10_000, rand=lambda: 0.5) == 300_000


def test_attempt_below_one_counts_as_the_first_attempt() -> None:
    assert compute_next_retry_delay_ms(DEFAULT_RETRY_POLICY, 0, rand=lambda: 0.5) == 1000


def test_steps_without_retry_use_the_default_policy() -> None:
    step = TaskStep(name="t", handler="h")
    assert step.retry is None
    assert step.effective_retry() == DEFAULT_RETRY_POLICY


def test_approval_step_defaults_to_a_single_attempt() -> None:
    step = ApprovalStep(name="review", content_key="draft")
    assert step.effective_retry().max_attempts == 1
    assert step.effective_retry().backoff_ms == 1000


def test_approval_step_keeps_one_attempt_when_only_backoff_is_overridden() -> None:
    step = ApprovalStep.model_validate({"name": "review", "contentKey": "draft", "retry": {"backoffMs": 500}})
    policy = step.effective_retry()
    assert policy.max_attempts == 1
    assert policy.backoff_ms == 500


def test_approval_step_accepts_an_explicit_max_attempts() -> None:
    step = ApprovalStep.model_validate({"name": "review", "contentKey": "draft", "retry": {"maxAttempts": 4}})
    assert step.effective_retry().max_attempts == 4


def test_retry_given_as_policy_object_merges_only_the_fields_set() -> None:
    step = ApprovalStep(name="review", content_key="draft", retry=RetryPolicy(backoff_multiplier=3))
    assert step.effective_retry().max_attempts == 1
    assert step.effective_retry().backoff_multiplier == 3


def test_user_retry_fields_override_defaults_individually() -> None:
    step = TaskStep.model_validate({"name": "t", "handler": "h", "retry": {"maxAttempts": 5}})
    assert step.effective_retry() == RetryPolicy(max_attempts=5)


def test_approval_retry_means_the_same_after_a_dump_and_parse_round_trip() -> None:
    definition = parse_definition(
        {
            "name": "wf",
            "version": "1",
            "steps": [
                {"type": "approval", "name": "review", "contentKey": "draft", "retry": {"backoffMs": 500}}
            ],
        }
    )
    again = parse_definition(definition.model_dump(by_alias=True, exclude_none=True))
    assert again.steps[0].effective_retry().max_attempts == 1
    assert again == definition
