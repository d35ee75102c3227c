"""The fake provider server itself, spoken to over plain HTTP (no SDK)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    error,
    openai_text,
)
from stevora.testing.fake_rate_limit import FakeRateLimit

ANTHROPIC_TOOL_TURN = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
}


def _post(
    server: FakeLLMServer, path: str, body: dict[str, Any], *, key: bool = True
) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = "Bearer test"
    request = urllib.request.Request(server.base_url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def _anthropic(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-haiku-4-5", "max_tokens": 10, "messages": messages, **extra}


def test_unscripted_request_gets_a_500_that_says_so(fake_llm: FakeLLMServer):
    status, body = _post(
        fake_llm, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 500
    assert "nothing scripted" in body["error"]["message"]


def test_errors_use_each_providers_body_shape(fake_llm: FakeLLMServer):
    fake_llm.enqueue(error(529, "Overloaded"), error(429, "slow down"))
    status, body = _post(fake_llm, "/v1/messages", _anthropic([{"role": "user", "content": "x"}]))
    assert status == 529
    assert body["type"] == "error"
    assert body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    status, body = _post(
        fake_llm, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 429
    assert body["error"]["message"] == "slow down"
    assert set(body["error"]) == {"message", "type", "param", "code"}


def test_missing_api_key_is_rejected(fake_llm: FakeLLMServer):
    fake_llm.anthropic.enqueue(anthropic_text("x"))
    status, body = _post(fake_llm, "/v1/messages", _anthropic([{"role": "user", "content": "x"}]), key=False)
    assert status == 401
    assert body["error"]["type"] == "authentication_error"
    assert fake_llm.anthropic.pending == 1  # a rejected request does not use up the script


def test_enqueue_routes_by_kind_and_journal_records_each_request(fake_llm: FakeLLMServer):
    fake_llm.enqueue(anthropic_text("from anthropic"), openai_text("from openai"))
    status, body = _post(
        fake_llm, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    )
    assert status == 200 and body["choices"][0]["message"]["content"] == "from openai"
    status, body = _post(fake_llm, "/v1/messages", _anthropic([{"role": "user", "content": "q"}]))
    assert status == 200 and body["content"][0]["text"] == "from anthropic"
    paths = [request.path for request in fake_llm.requests]
    assert paths == ["/v1/chat/completions", "/v1/messages"]
    assert fake_llm.anthropic.requests[0].json["max_tokens"] == 10


def test_kindless_errors_and_api_answers_are_served_in_queue_order(fake_llm: FakeLLMServer):
    fake_llm.enqueue(error(503, "first"), openai_text("second"))
    chat = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    assert _post(fake_llm, "/v1/chat/completions", chat)[0] == 503
    assert _post(fake_llm, "/v1/chat/completions", chat)[0] == 200
    assert fake_llm.openai.pending == 0


def test_queueing_a_response_for_the_wrong_api_fails_fast(fake_llm: FakeLLMServer):
    with pytest.raises(ValueError, match="openai"):
        fake_llm.anthropic.enqueue(openai_text("x"))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            _anthropic(
                [
                    {"role": "user", "content": "x"},
                    ANTHROPIC_TOOL_TURN,
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "first"},
                            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"},
                        ],
                    },
                ]
            ),
            "must come first",
        ),
        (
            _anthropic(
                [
                    {"role": "user", "content": "x"},
                    ANTHROPIC_TOOL_TURN,
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "r"}],
                    },
                ]
            ),
            "unexpected `tool_use_id`",
        ),
        (
            _anthropic(
                [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "call.1", "name": "f", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "call.1", "content": "r"}],
                    },
                ]
            ),
            "String should match",
        ),
        (_anthropic([{"role": "system", "content": "x"}]), "role"),
    ],
)
def test_anthropic_requests_the_real_api_rejects_get_a_400(
    fake_llm: FakeLLMServer, body: dict[str, Any], expected: str
):
    fake_llm.anthropic.enqueue(anthropic_text("should not be served"))
    status, answer = _post(fake_llm, "/v1/messages", body)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert expected in answer["error"]["message"]


def test_openai_tool_message_without_a_preceding_call_gets_a_400(fake_llm: FakeLLMServer):
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "call_1", "content": "r"},
        ],
    }
    status, answer = _post(fake_llm, "/v1/chat/completions", body)
    assert status == 400
    assert "must be a response to a preceeding message" in answer["error"]["message"]


def test_openai_arguments_must_be_a_string(fake_llm: FakeLLMServer):
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "r"},
        ],
    }
    status, answer = _post(fake_llm, "/v1/chat/completions", body)
    assert status == 400
    assert "arguments" in answer["error"]["message"]


def test_responder_answers_when_the_queue_is_empty(fake_llm: FakeLLMServer):
    fake_llm.openai.responder = lambda body: openai_text(f"echo {body['messages'][-1]['content']}")
    status, body = _post(
        fake_llm, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "echo hi"


def test_reset_clears_scripts_responders_and_journal(fake_llm: FakeLLMServer):
    fake_llm.openai.enqueue(openai_text("x"))
    fake_llm.openai.responder = lambda body: openai_text("y")
    _post(fake_llm, "/v1/messages", _anthropic([{"role": "user", "content": "x"}]))
    fake_llm.reset()
    assert fake_llm.requests == [] and fake_llm.openai.pending == 0 and fake_llm.openai.responder is None


def test_base_urls_match_what_each_sdk_expects():
    with FakeLLMServer() as server:
        assert server.openai_base_url == f"http://127.0.0.1:{server.port}/v1"
        assert server.anthropic_base_url == f"http://127.0.0.1:{server.port}"


def test_the_enforcing_mode_answers_429_beyond_the_window_and_charges_the_usage(fake_llm: FakeLLMServer):
    fake_llm.rate_limit = FakeRateLimit(requests=2, tokens=1_000, window_s=60)
    fake_llm.responder = lambda _body: openai_text("ok", usage={"prompt_tokens": 3, "completion_tokens": 2})
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 100}
    assert _post(fake_llm, "/v1/chat/completions", body)[0] == 200  # estimated 200 tokens, used 5
    assert _post(fake_llm, "/v1/chat/completions", body)[0] == 200
    request = urllib.request.Request(
        fake_llm.base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": "Bearer test"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    with refused.value as answer:
        assert answer.code == 429
        assert float(answer.headers["retry-after-ms"]) > 25_000  # one request per 30 s
        assert answer.headers["x-ratelimit-remaining-requests"] == "0"
        # The two answered calls were charged their usage (5 each), not their estimates (200 each).
        assert int(answer.headers["x-ratelimit-remaining-tokens"]) >= 989
    assert [d.status for d in fake_llm.rate_limit.log] == [200, 200, 429]
