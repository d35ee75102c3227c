"""`runs diff` cuts each side to one line around where the two differ, not from the start (two
long answers that share a beginning used to be cut exactly before their difference)."""

from __future__ import annotations

from typing import Any

from stevora.cli.time_travel import brief_pair


def _side(text: str) -> dict[str, Any]:
    return {"model": "gpt-4o", "toolCalls": [], "text": text, "results": None}


def test_the_differing_part_of_two_long_texts_is_shown() -> None:
    shared = "The refund policy for enterprise customers says that every request is reviewed " * 2
    a, b = brief_pair(_side(shared + "within 30 days."), _side(shared + "within 14 days."))
    assert "30 days" in a and "14 days" in b
    assert a.startswith("...") and len(a) <= 110 and len(b) <= 110


def test_short_or_equal_sides_are_shown_from_the_start() -> None:
    assert brief_pair(_side("yes"), _side("no")) == ('gpt-4o: "yes"', 'gpt-4o: "no"')
    long = "x" * 300
    a, b = brief_pair(_side(long), _side(long))
    assert a == b and a.startswith('gpt-4o: "xxx') and a.endswith("...")
    assert brief_pair(None, _side("hi"))[0] == "(none)"


def test_an_early_difference_keeps_the_start() -> None:
    a, b = brief_pair(_side("A" + "y" * 300), _side("B" + "y" * 300))
    assert a.startswith('gpt-4o: "A') and b.startswith('gpt-4o: "B')
