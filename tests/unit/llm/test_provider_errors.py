"""SDK-neutral error translation: retryable statuses, Retry-After headers, tool input parsing."""

from __future__ import annotations

import email.utils
import time

import pytest

from stevora.llm.anthropic_provider import REMAINING_HEADERS as ANTHROPIC_REMAINING
from stevora.llm.openai_provider import REMAINING_HEADERS as OPENAI_REMAINING
from stevora.llm.provider import (
    error_message_from_body,
    is_invalid_request_answer,
    parse_tool_input,
    provider_error_for_status,
    retry_after_from_headers,
)


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_transient_statuses_are_retryable(status: int):
    err = provider_error_for_status("openai", status, "x")
    assert err.retryable is True
    assert err.status_code == status
    assert err.code == "LLM_PROVIDER_ERROR"
    assert err.details == {"provider": "openai", "statusCode": status, "retryAfterSeconds": None}


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 413, 422])
def test_request_problems_are_not_retryable(status: int):
    assert provider_error_for_status("anthropic", status, "x", {"retry-after": "3"}).retryable is False


def test_x_should_retry_header_overrides_the_status_rule():
    assert provider_error_for_status("openai", 429, "quota", {"x-should-retry": "false"}).retryable is False
    assert provider_error_for_status("openai", 400, "odd", {"X-Should-Retry": "true"}).retryable is True


def test_retry_after_ms_wins_over_retry_after():
    assert retry_after_from_headers({"retry-after-ms": "250", "retry-after": "9"}) == pytest.approx(0.25)
    assert retry_after_from_headers({"Retry-After": "3"}) == pytest.approx(3.0)
    assert retry_after_from_headers({"retry-after-ms": "junk", "retry-after": "2"}) == pytest.approx(2.0)
    assert retry_after_from_headers({}) is None
    assert retry_after_from_headers({"retry-after": "soon"}) is None


def test_retry_after_as_http_date():
    in_ten_s = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert retry_after_from_headers({"retry-after": in_ten_s}) == pytest.approx(10, abs=1.5)


def test_retry_after_reaches_the_error():
    err = provider_error_for_status("anthropic", 429, "slow", {"retry-after-ms": "1500"})
    assert err.retry_after_s == pytest.approx(1.5)
    assert err.details["retryAfterSeconds"] == pytest.approx(1.5)


def test_error_message_comes_from_either_providers_body():
    assert error_message_from_body({"error": {"message": "bad key", "type": "x"}}, "f") == "bad key"
    assert (
        error_message_from_body({"type": "error", "error": {"type": "x", "message": "over"}}, "f") == "over"
    )
    assert error_message_from_body(None, "fallback") == "fallback"


def test_tool_input_parsing_mirrors_what_handlers_receive():
    assert parse_tool_input('{"a": 1}') == {"a": 1}
    assert parse_tool_input("") == {}
    assert parse_tool_input('{"a": ') == {"raw": '{"a": '}
    assert parse_tool_input("[1, 2]") == {"raw": "[1, 2]"}


LLAMACPP_500 = {
    "error": {
        "message": "7 validation errors:\n  {'type': 'string_type', 'loc': ('body', 'messages', 2, "
        "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid string'}",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}


@pytest.mark.parametrize(
    "body",
    [
        LLAMACPP_500,
        {"error": {"message": "1 validation error for CreateChatCompletionRequest", "type": "server_error"}},
        {"error": {"message": "bad tool_choice", "type": "invalid_request_error"}},
        {"detail": [{"loc": ["body", "messages", 0], "msg": "field required"}]},
    ],
)
def test_a_5xx_whose_body_says_the_request_is_invalid_is_recognised(body: object) -> None:
    assert is_invalid_request_answer(500, body)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, {"error": {"message": "CUDA out of memory", "type": "internal_server_error"}}),
        (503, {"error": {"message": "model is loading", "type": "server_error"}}),
        (502, "<html>Bad Gateway</html>"),
        (400, LLAMACPP_500),  # a 4xx is already not retried; the rule only reclassifies 5xx
    ],
)
def test_other_server_errors_stay_retryable_server_errors(status: int, body: object) -> None:
    assert not is_invalid_request_answer(status, body)


def test_a_429_carries_what_the_rate_limit_headers_say_remains():
    openai_headers = {"X-RateLimit-Remaining-Requests": "0", "x-ratelimit-remaining-tokens": "1500"}
    openai_style = provider_error_for_status("openai", 429, "x", openai_headers, OPENAI_REMAINING)
    assert openai_style.remaining == (0.0, 1500.0)
    anthropic_style = provider_error_for_status(
        "anthropic", 429, "x", {"anthropic-ratelimit-tokens-remaining": "7"}, ANTHROPIC_REMAINING
    )
    assert anthropic_style.remaining == (None, 7.0)
    # Each adapter reads its own provider's names only; not a 429: nothing read.
    assert provider_error_for_status(
        "anthropic", 429, "x", openai_headers, ANTHROPIC_REMAINING
    ).remaining == (
        None,
        None,
    )
    assert provider_error_for_status(
        "openai", 500, "x", {"x-ratelimit-remaining-tokens": "3"}, OPENAI_REMAINING
    ).remaining == (None, None)
    assert provider_error_for_status(
        "openai",
        429,
        "x",
        {"x-ratelimit-remaining-tokens": "-1", "x-ratelimit-remaining-requests": "inf"},
        OPENAI_REMAINING,
    ).remaining == (None, None)
