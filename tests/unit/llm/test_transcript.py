"""prepare_transcript: tool calls paired with results, portable ids, no empty assistant turns."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from stevora.llm.messages import Message, ToolCall
from stevora.llm.transcript import INTERRUPTED_RESULT, TranscriptRepair, prepare_transcript


def _call(call_id: str, name: str = "lookup") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments="{}")


def test_well_formed_transcript_is_unchanged():
    messages = [
        Message.system("sys"),
        Message.user("q"),
        Message.assistant(None, [_call("call_a"), _call("call_b")]),
        Message.tool_result("call_a", "1"),
        Message.tool_result("call_b", "2"),
        Message.assistant("done"),
    ]
    assert prepare_transcript(messages, provider_name="openai") == messages


def test_dangling_call_gets_an_interrupted_error_result():
    messages = [Message.user("q"), Message.assistant(None, [_call("call_a"), _call("call_b")])]
    messages.append(Message.tool_result("call_a", "ok"))
    out = prepare_transcript(messages, provider_name="anthropic")

    assert out[-1] == Message.tool_result("call_b", INTERRUPTED_RESULT, name="lookup", is_error=True)
    assert json.loads(out[-1].content or "") == {
        "error": "Tool call was interrupted before it produced a result"
    }
    assert out[-2] == Message.tool_result("call_a", "ok")


def test_orphan_and_duplicate_results_are_dropped_keeping_the_first():
    messages = [
        Message.tool_result("call_x", "orphan before any call"),
        Message.user("q"),
        Message.assistant(None, [_call("call_a")]),
        Message.tool_result("call_a", "first"),
        Message.tool_result("call_a", "second"),
        Message.tool_result("call_unknown", "stray"),
    ]
    out = prepare_transcript(messages, provider_name="openai")
    assert out == [
        Message.user("q"),
        Message.assistant(None, [_call("call_a")]),
        Message.tool_result("call_a", "first"),
    ]


def test_results_separated_from_their_call_are_moved_right_after_it():
    messages = [
        Message.user("q"),
        Message.assistant(None, [_call("call_a"), _call("call_b")]),
        Message.tool_result("call_b", "b"),
        Message.user("interjection"),
        Message.tool_result("call_a", "a"),
    ]
    out = prepare_transcript(messages, provider_name="openai")
    assert [m.role for m in out] == ["user", "assistant", "tool", "tool", "user"]
    assert [m.tool_call_id for m in out[2:4]] == ["call_a", "call_b"]  # in call order
    assert out[4] == Message.user("interjection")


def test_invalid_and_repeated_ids_are_renamed_with_their_results():
    messages = [
        Message.user("q"),
        Message.assistant(None, [_call("call.1/odd"), _call("")]),
        Message.tool_result("call.1/odd", "r1"),
        Message.tool_result("", "r2"),
        Message.assistant(None, [_call("call_same")]),
        Message.tool_result("call_same", "r3"),
        Message.assistant(None, [_call("call_same")]),  # providers may reuse ids across rounds
        Message.tool_result("call_same", "r4"),
        Message.assistant(None, [_call("x" * 41)]),  # longer than OpenAI's 40-character cap
        Message.tool_result("x" * 41, "r5"),
    ]
    out = prepare_transcript(messages, provider_name="openai")

    calls = [call.id for m in out for call in m.tool_calls]
    results = [(m.tool_call_id, m.content) for m in out if m.role == "tool"]
    assert calls == ["call_1_0", "call_1_1", "call_same", "call_3_0", "call_4_0"]
    assert results == [
        ("call_1_0", "r1"),
        ("call_1_1", "r2"),
        ("call_same", "r3"),
        ("call_3_0", "r4"),
        ("call_4_0", "r5"),
    ]


def test_renaming_is_deterministic_and_avoids_existing_ids():
    messages = [
        Message.user("q"),
        Message.assistant(None, [_call("bad id")]),
        Message.tool_result("bad id", "r1"),
        Message.assistant(None, [_call("call_1_0")]),  # a real id that collides with the generated one
        Message.tool_result("call_1_0", "r2"),
    ]
    first = prepare_transcript(messages, provider_name="anthropic")
    assert first == prepare_transcript(messages, provider_name="anthropic")
    ids = [call.id for m in first for call in m.tool_calls]
    assert len(set(ids)) == 2
    assert [m.tool_call_id for m in first if m.role == "tool"] == ids


def test_calls_with_one_id_twice_in_a_turn_are_answered_in_order():
    messages = [
        Message.user("q"),
        Message.assistant(None, [_call("dup"), _call("dup")]),
        Message.tool_result("dup", "first"),
        Message.tool_result("dup", "second"),
    ]
    out = prepare_transcript(messages, provider_name="openai")
    ids = [c.id for c in out[1].tool_calls]
    assert ids[0] == "dup" and ids[1] != "dup"
    assert [(m.tool_call_id, m.content) for m in out[2:]] == [(ids[0], "first"), (ids[1], "second")]


def test_empty_assistant_turns_are_dropped_and_none_results_become_empty_text():
    messages = [
        Message.user("q"),
        Message.assistant(None),
        Message.assistant(""),
        Message.assistant(None, [_call("call_a")]),
        Message(role="tool", content=None, tool_call_id="call_a"),
    ]
    out = prepare_transcript(messages, provider_name="openai")
    assert [m.role for m in out] == ["user", "assistant", "tool"]
    assert out[2].content == ""


def test_mistral_gets_nine_character_alphanumeric_ids():
    messages = [
        Message.user("q"),
        Message.assistant(None, [_call("call_abc")]),
        Message.tool_result("call_abc", "r"),
    ]
    out = prepare_transcript(messages, provider_name="mistral")
    new_id = out[1].tool_calls[0].id
    assert len(new_id) == 9 and new_id.isalnum()
    assert out[2].tool_call_id == new_id


def test_input_list_is_not_modified():
    messages = [Message.user("q"), Message.assistant(None, [_call("bad id")])]
    snapshot = list(messages)
    prepare_transcript(messages, provider_name="openai")
    assert messages == snapshot


# -- TranscriptRepair: the same repair for a growing transcript, without redoing its prefix --------

_IDS = ["call_a", "call_b", "call_1_0", "bad id", "", "x" * 41, "abcdefghi"]


@st.composite
def _growing_transcript(draw: st.DrawFn) -> list[Message]:
    """Anything the loop (or a replay of odd stored rows) can append, in any order."""
    kinds = st.sampled_from(
        ["user", "assistant_calls", "assistant_text", "assistant_empty", "tool", "tool_none"]
    )
    messages: list[Message] = []
    for kind in draw(st.lists(kinds, max_size=30)):
        if kind == "user":
            messages.append(Message.user("u"))
        elif kind == "assistant_calls":
            ids = draw(st.lists(st.sampled_from(_IDS), min_size=1, max_size=3))
            messages.append(Message.assistant(None, [_call(i) for i in ids]))
        elif kind == "assistant_text":
            messages.append(Message.assistant("text"))
        elif kind == "assistant_empty":
            messages.append(Message.assistant(None))
        elif kind == "tool":
            messages.append(Message.tool_result(draw(st.sampled_from(_IDS)), "r"))
        else:
            messages.append(Message(role="tool", content=None, tool_call_id=draw(st.sampled_from(_IDS))))
    return messages


@settings(max_examples=300, deadline=None)
@given(_growing_transcript(), st.sampled_from(["openai", "anthropic", "mistral"]))
def test_incremental_repair_equals_the_full_repair_after_every_append(
    messages: list[Message], provider: str
) -> None:
    repair = TranscriptRepair(provider)
    grown: list[Message] = []
    for message in messages:
        grown.append(message)
        assert repair.prepare(grown) == prepare_transcript(grown, provider_name=provider)
    # Asked twice without a change: the same answer (the open segment's ids are not kept).
    assert repair.prepare(grown) == prepare_transcript(grown, provider_name=provider)


def test_incremental_repair_starts_over_when_the_list_is_not_just_appended_to() -> None:
    repair = TranscriptRepair("openai")
    messages = [
        Message.user("q"),
        Message.assistant(None, [_call("call_a")]),
        Message.tool_result("call_a", "1"),
        Message.assistant(None, [_call("call_b")]),
    ]
    repair.prepare(messages)
    replaced = [Message.user("other"), *messages[1:]]  # another list
    assert repair.prepare(replaced) == prepare_transcript(replaced, provider_name="openai")
    del replaced[2:]  # shorter than the repaired prefix
    assert repair.prepare(replaced) == prepare_transcript(replaced, provider_name="openai")
    replaced.append(Message.tool_result("call_a", "2"))
    replaced.append(Message.assistant("done"))
    replaced[2] = Message.tool_result("call_a", "3")  # the last repaired message replaced
    assert repair.prepare(replaced) == prepare_transcript(replaced, provider_name="openai")


def test_incremental_repair_does_the_same_work_at_round_100_as_at_round_1() -> None:
    """The kept prefix is not looked at again: the messages read per call stay constant."""
    reads: list[int] = []

    class Counting(list[Message]):
        def __getitem__(self, index):  # type: ignore[no-untyped-def]
            reads[-1] += 1
            return super().__getitem__(index)

    repair = TranscriptRepair("openai")
    messages = Counting([Message.user("q")])
    for k in range(1, 101):
        messages.append(Message.assistant(None, [_call(f"call_{k}")]))
        messages.append(Message.tool_result(f"call_{k}", "r"))
        reads.append(0)
        assert repair.prepare(messages) == prepare_transcript(list(messages), provider_name="openai")
    assert reads[99] == reads[1]
