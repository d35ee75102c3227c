"""The stream accumulator the adapters share, and the scripted provider's simulated stream."""

from __future__ import annotations

import pytest

from stevora.errors import ProviderError
from stevora.llm.messages import LlmRequest, Message, ToolCall, Usage
from stevora.llm.scripted_provider import ScriptedProvider
from stevora.llm.streaming import StreamAccumulator


class Sink:
    def __init__(self) -> None:
        self.first = 0
        self.pieces: list[str] = []

    def first_token(self) -> None:
        self.first += 1

    def text(self, piece: str) -> None:
        self.pieces.append(piece)


def test_fragments_by_index_join_into_calls_and_the_sink_hears_the_first_token_once() -> None:
    sink = Sink()
    acc = StreamAccumulator("openai", sink)
    acc.text(None)  # a role-only delta
    acc.text("")
    assert sink.first == 0
    acc.text("Look")
    acc.tool_start(1, "call_B", "get_time")
    acc.tool_start(0, "call_A", "get_weather")
    acc.tool_arguments(0, '{"ci')
    acc.tool_arguments(0, 'ty":"Paris"}')
    acc.tool_start(0, "call_A", "get_weather")  # llama.cpp repeats the id and name in every fragment
    acc.text("ing.")
    acc.usage, acc.model, acc.response_id = Usage(input_tokens=3), "gpt-x", "chatcmpl-1"
    acc.finish_reason, acc.finished = "tool_calls", True

    response = acc.response("stop")
    assert response.text == "Looking."
    assert response.tool_calls == [
        ToolCall("call_A", "get_weather", '{"city":"Paris"}'),
        ToolCall("call_B", "get_time", ""),
    ]
    assert (response.finish_reason, response.model, response.response_id) == (
        "tool_calls",
        "gpt-x",
        "chatcmpl-1",
    )
    assert sink.first == 1 and sink.pieces == ["Look", "ing."]


def test_a_stream_without_its_final_event_is_a_retryable_error() -> None:
    acc = StreamAccumulator("anthropic")
    acc.text("half an ans")
    with pytest.raises(ProviderError) as caught:
        acc.response("end_turn")
    assert caught.value.retryable and "ended before its final event" in caught.value.message


def _request(sink: Sink | None) -> LlmRequest:
    return LlmRequest(model="scripted", messages=[Message.user("Tell me about refunds, please.")], sink=sink)


async def test_the_scripted_provider_streams_only_when_it_has_a_delay_and_a_listener() -> None:
    instant = Sink()
    answer = await ScriptedProvider().complete(_request(instant))
    assert answer.text and instant.first == 0 and instant.pieces == []  # no delay: nothing heard

    delayed = Sink()
    answer = await ScriptedProvider(latency_s=0.05).complete(_request(delayed))
    assert delayed.first == 1 and len(delayed.pieces) > 1 and "".join(delayed.pieces) == answer.text


async def test_a_scripted_error_still_takes_the_delay_and_is_raised() -> None:
    sink = Sink()
    provider = ScriptedProvider([ProviderError("boom", provider="scripted", retryable=True)], latency_s=0.01)
    with pytest.raises(ProviderError, match="boom"):
        await provider.complete(_request(sink))
    assert sink.first == 0
