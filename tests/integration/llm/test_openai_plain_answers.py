"""OpenAI's plain (non-streamed) answers, read as JSON by the adapters while the SDK sends the
request: the same `LlmResponse` the SDK's models gave, and whatever else a server sends a
retryable `ProviderError`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from stevora.errors import ProviderError
from stevora.llm.messages import LlmRequest, LlmResponse, Message, ReasoningItem, ToolCall, Usage
from stevora.llm.openai_provider import OpenAIProvider
from stevora.testing.fake_llm import FakeLLMServer, as_is_server, openai_text, openai_tool_calls
from stevora.testing.fake_responses import responses_text, responses_tool_calls
from stevora.testing.fake_stream import FakeResponse

OpenAIFactory = Callable[..., OpenAIProvider]


def _custom_tool_call() -> FakeResponse:
    answer = openai_tool_calls([("call_1", "f", "{}")])
    assert answer.body is not None
    answer.body["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_c", "type": "custom", "custom": {"name": "grep", "input": "free text"}}
    ]
    return answer


def _refusal() -> FakeResponse:
    answer = openai_text("unused")
    assert answer.body is not None
    answer.body["choices"][0]["message"].update(content=None, refusal="I can't help with that.")
    answer.body["choices"][0]["finish_reason"] = "content_filter"
    return answer


def _without_usage() -> FakeResponse:
    answer = openai_text("no usage")
    assert answer.body is not None
    del answer.body["usage"]
    return answer


def _incomplete() -> FakeResponse:
    answer = responses_text("cut short", reasoning="long thought")
    assert answer.body is not None
    answer.body.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    return answer


CHAT_ANSWERS: dict[str, Callable[[], FakeResponse]] = {
    "text": lambda: openai_text("Paris."),
    "usage-details": lambda: openai_text(
        "cached",
        usage={
            "prompt_tokens": 120,
            "prompt_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 32},
            "completion_tokens_details": {"reasoning_tokens": 7},
        },
    ),
    "length": lambda: openai_text("cut", finish_reason="length"),
    "tool-calls": lambda: openai_tool_calls([("call_1", "f", '{"a":1}'), ("call_2", "g", "not json")]),
    "tool-calls-with-text": lambda: openai_tool_calls([("call_1", "f", "{}")], text="Let me look."),
    "custom-tool-call": _custom_tool_call,
    "refusal": _refusal,
    "no-usage": _without_usage,
}

RESPONSES_ANSWERS: dict[str, Callable[[], FakeResponse]] = {
    "text": lambda: responses_text("Paris."),
    "reasoning-text": lambda: responses_text("Paris.", reasoning="capital of France"),
    "reasoning-tool-calls": lambda: responses_tool_calls(
        [("call_1", "f", '{"a":1}'), ("call_2", "g", "{}")], reasoning="two lookups"
    ),
    "tool-calls": lambda: responses_tool_calls([("call_1", "f", "{}")]),
    "cached": lambda: responses_text("again", usage={"input_tokens_details": {"cached_tokens": 16}}),
    "incomplete": _incomplete,
}


def _from_chat_completion(completion: ChatCompletion, provider: str) -> LlmResponse:
    """What the adapter made of the SDK's `ChatCompletion` before it read the JSON itself."""
    choice = completion.choices[0]
    calls = [
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
        if c.type == "function"
        else ToolCall(id=c.id, name=c.custom.name, arguments=c.custom.input)
        for c in choice.message.tool_calls or ()
    ]
    usage = completion.usage
    prompt = usage.prompt_tokens_details if usage else None
    completion_details = usage.completion_tokens_details if usage else None
    return LlmResponse(
        text=choice.message.content,
        tool_calls=calls,
        usage=Usage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            cache_read_tokens=(prompt.cached_tokens or 0) if prompt else 0,
            cache_write_tokens=(prompt.cache_write_tokens or 0) if prompt else 0,
            reasoning_tokens=(completion_details.reasoning_tokens or 0) if completion_details else 0,
        )
        if usage
        else Usage(),
        model=completion.model,
        finish_reason=str(choice.finish_reason or ("tool_calls" if calls else "stop")),
        response_id=completion.id,
        provider=provider,
    )


def _from_response(response: Response, provider: str) -> LlmResponse:
    """What the adapter made of the SDK's `Response` before it read the JSON itself."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningItem] = []
    ids: dict[str, Any] = {}
    for item in response.output:
        if item.type == "reasoning":
            dumped = item.model_dump(mode="json", exclude_none=True)
            reasoning.append(ReasoningItem.of("openai_responses", dumped))
        elif item.type == "function_call":
            calls.append(ToolCall(id=item.call_id, name=item.name, arguments=item.arguments))
            if item.id:
                ids.setdefault("calls", {})[item.call_id] = item.id
        elif item.type == "message":
            texts += [part.text for part in item.content if part.type == "output_text"]
            ids.setdefault("message", item.id)
    if reasoning and ids:
        reasoning.append(ReasoningItem.of("openai_item_ids", ids))
    finish = "tool_calls" if calls else "stop"
    if response.status == "incomplete" and response.incomplete_details is not None:
        finish = {"max_output_tokens": "length"}.get(str(response.incomplete_details.reason), "length")
    usage = response.usage
    return LlmResponse(
        text="".join(texts) if texts else None,
        tool_calls=calls,
        usage=Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.input_tokens_details.cached_tokens,
            reasoning_tokens=usage.output_tokens_details.reasoning_tokens,
        )
        if usage
        else Usage(),
        model=response.model,
        finish_reason=finish,
        response_id=response.id,
        provider=provider,
        reasoning=reasoning,
    )


@pytest.mark.parametrize("kind", list(CHAT_ANSWERS))
async def test_a_plain_chat_answer_read_as_json_is_what_the_sdks_model_gave(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory, kind: str
) -> None:
    answer = CHAT_ANSWERS[kind]()
    fake_llm.openai.enqueue(answer, answer)  # the same body twice: once for each path
    provider = make_openai()
    provider.stream = False
    read = await provider.complete(LlmRequest(model="gpt-4o-mini", messages=[Message.user("q")]))
    completion = await provider.client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}]
    )
    assert read == _from_chat_completion(completion, "openai")
    assert [r.json.get("stream") for r in fake_llm.openai.requests] == [None, None]


@pytest.mark.parametrize("kind", list(RESPONSES_ANSWERS))
async def test_a_plain_responses_answer_read_as_json_is_what_the_sdks_model_gave(
    fake_llm: FakeLLMServer, make_openai: OpenAIFactory, kind: str
) -> None:
    answer = RESPONSES_ANSWERS[kind]()
    fake_llm.responses.enqueue(answer, answer)
    provider = make_openai()
    provider.stream = False
    # The fake adds a fresh reasoning item to a reasoning model's answer that has none.
    assert answer.body is not None
    model = "o4-mini" if any(i["type"] == "reasoning" for i in answer.body["output"]) else "gpt-4.1"
    read = await provider.complete(LlmRequest(model=model, messages=[Message.user("q")], api="responses"))
    response = await provider.client.responses.create(
        model=model, input="q", store=False, include=["reasoning.encrypted_content"]
    )
    assert read == _from_response(response, "openai")


async def _plain_error(body: bytes, api: str) -> ProviderError:
    """The error a plain call gets when a server answers `body` with a 200 (no SDK retries)."""
    with as_is_server(body, "application/json") as url:
        provider = OpenAIProvider("test", f"{url}/v1", max_retries=0, stream=False)
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(LlmRequest(model="m", messages=[Message.user("q")], api=api))  # type: ignore[arg-type]
        finally:
            await provider.aclose()
    return caught.value


_CHAT_OK = {"id": "c", "model": "m", "object": "chat.completion", "created": 1}
_CHOICE_OK = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}


def _chat(**fields: Any) -> bytes:
    return json.dumps({**_CHAT_OK, "choices": [_CHOICE_OK], **fields}).encode()


def _chat_message(**message: Any) -> bytes:
    return _chat(choices=[{**_CHOICE_OK, "message": {"role": "assistant", **message}}])


def _function_call(**call: Any) -> dict[str, Any]:
    return {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}, **call}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param(b"{not json", "not a chat completion", id="not-json"),
        pytest.param(b"", "not a chat completion", id="empty-body"),
        pytest.param(b"null", "not a chat completion", id="null"),
        pytest.param(b"[1, 2]", "not a chat completion", id="a-list"),
        pytest.param(_chat(choices=None), "returned no choices", id="no-choices"),
        pytest.param(_chat(choices=[]), "returned no choices", id="empty-choices"),
        pytest.param(_chat(choices=["c"]), "not a chat completion", id="choice-not-an-object"),
        pytest.param(_chat(choices=[{"index": 0, "message": "hi"}]), "not a chat completion", id="message-not-an-object"),
        pytest.param(_chat_message(content=["hi"]), "not a chat completion", id="content-a-list"),
        pytest.param(_chat_message(tool_calls="f"), "not a chat completion", id="tool-calls-a-string"),
        pytest.param(_chat_message(tool_calls=["f"]), "not a chat completion", id="tool-call-not-an-object"),
        pytest.param(_chat_message(tool_calls=[_function_call(id=["t"])]), "not a chat completion", id="call-id-a-list"),
        pytest.param(_chat_message(tool_calls=[_function_call(function="f")]), "not a chat completion", id="function-a-string"),
        pytest.param(_chat_message(tool_calls=[_function_call(type="mystery")]), "not a chat completion", id="no-known-type"),
        pytest.param(_chat_message(tool_calls=[_function_call(type=None)]), "not a chat completion", id="call-without-type"),
        pytest.param(_chat(id=7), "not a chat completion", id="id-a-number"),
        pytest.param(_chat(model=None), "not a chat completion", id="no-model"),
        pytest.param(_chat(usage={"prompt_tokens": "9", "completion_tokens": 1}), "not a chat completion", id="count-a-string"),
        pytest.param(_chat(usage={"prompt_tokens": 9, "completion_tokens": True}), "not a chat completion", id="count-a-bool"),
        pytest.param(_chat(usage={"prompt_tokens": 9}), "not a chat completion", id="count-missing"),
        pytest.param(_chat(usage={"prompt_tokens": 2**31, "completion_tokens": 1}), "not a chat", id="count-past-an-integer"),
        pytest.param(_chat(usage={"prompt_tokens": 9, "completion_tokens": -1}), "not a chat completion", id="count-negative"),
        pytest.param(_chat(usage=[9, 1]), "not a chat completion", id="usage-a-list"),
        pytest.param(
            _chat(usage={"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": "x"}),
            "not a chat completion",
            id="details-a-string",
        ),
        pytest.param(
            _chat(usage={"prompt_tokens": 9, "completion_tokens": 1, "completion_tokens_details": {"reasoning_tokens": 1.5}}),
            "not a chat completion",
            id="reasoning-a-float",
        ),
    ],
)  # fmt: skip
async def test_every_hostile_plain_chat_answer_is_a_retryable_provider_error(body: bytes, says: str) -> None:
    error = await _plain_error(body, "chat")
    assert error.retryable and says in error.message


_RESPONSE_OK = {"id": "r", "model": "m", "object": "response", "status": "completed", "output": []}


def _response(**fields: Any) -> bytes:
    return json.dumps({**_RESPONSE_OK, **fields}).encode()


def _message(*content: object) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "status": "completed",
        "content": list(content),
    }


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"", id="empty-body"),
        pytest.param(b"[]", id="a-list"),
        pytest.param(_response(output=None), id="no-output"),
        pytest.param(_response(output=["item"]), id="item-not-an-object"),
        pytest.param(_response(output=[_message("text")]), id="part-not-an-object"),
        pytest.param(_response(output=[_message({"type": "output_text", "text": ["hi"]})]), id="text-a-list"),
        pytest.param(_response(output=[{"type": "message", "id": "m", "content": None}]), id="content-missing"),
        pytest.param(
            _response(output=[{"type": "function_call", "call_id": ["c"], "name": "f", "arguments": "{}"}]),
            id="call-id-a-list",
        ),
        pytest.param(
            _response(output=[{"type": "function_call", "call_id": "c", "name": 7, "arguments": "{}"}]),
            id="name-a-number",
        ),
        pytest.param(_response(id=["r"]), id="id-a-list"),
        pytest.param(_response(model=None), id="no-model"),
        pytest.param(_response(status="failed", error="boom"), id="error-a-string"),
        pytest.param(_response(status="incomplete", incomplete_details="cut"), id="details-a-string"),
        pytest.param(_response(usage={"input_tokens": 1}), id="count-missing"),
        pytest.param(_response(usage={"input_tokens": 1, "output_tokens": 2, "input_tokens_details": {}}), id="details-empty"),
        pytest.param(
            _response(usage={"input_tokens": 1, "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": "3"}}),
            id="reasoning-a-string",
        ),
    ],
)  # fmt: skip
async def test_every_hostile_plain_responses_answer_is_a_retryable_provider_error(body: bytes) -> None:
    error = await _plain_error(body, "responses")
    assert error.retryable and "not a Responses API response" in error.message


async def test_a_failed_plain_response_is_a_retryable_provider_error_with_its_message() -> None:
    error = await _plain_error(
        _response(status="failed", error={"code": "e", "message": "the model broke"}), "responses"
    )
    assert error.retryable and error.message == "openai response failed: the model broke"


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("strict", [True, False])
async def test_a_strict_client_still_checks_plain_answers_against_the_sdks_models(
    api: str, strict: bool
) -> None:
    """An answer the adapter can read but the SDK's model refuses (a choice or an item without the
    fields the API always sends): refused by a client built with `_strict_response_validation`,
    as `create` refused it, and read by any other."""
    body = (
        _chat(choices=[{"message": {"content": "hi"}}])
        if api == "chat"
        else _response(output=[{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}])
    )
    with as_is_server(body, "application/json") as url:
        client = openai.AsyncOpenAI(
            api_key="test", base_url=f"{url}/v1", max_retries=0, _strict_response_validation=strict
        )
        provider = OpenAIProvider("test", client=client, stream=False)
        request = LlmRequest(model="m", messages=[Message.user("q")], api=api)  # type: ignore[arg-type]
        try:
            if strict:
                with pytest.raises(ProviderError) as caught:
                    await provider.complete(request)
                assert caught.value.retryable and "validation error" in caught.value.message
            else:
                assert (await provider.complete(request)).text == "hi"
        finally:
            await client.close()
