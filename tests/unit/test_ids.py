"""ids: the format, the time prefix's order, a uniform random tail (no modulo bias)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from stevora import ids
from stevora.ids import new_id, random_token

_ID = re.compile(r"^run_[0-9a-z]{9}[0-9a-z]{12}$")


def _reference_base36(n: int, width: int) -> str:
    """The former digit-by-digit encoding, which the table-based one must equal."""
    out = []
    for _ in range(width):
        n, r = divmod(n, 36)
        out.append("0123456789abcdefghijklmnopqrstuvwxyz"[r])
    return "".join(reversed(out))


@pytest.mark.parametrize("ms", [0, 1, 35, 36, 1295, 1296, 1_764_150_000_123, 36**8, 36**9 - 1])
def test_time_part_is_the_zero_padded_base36_millisecond(ms: int) -> None:
    assert ids._stamp(ms) == _reference_base36(ms, 9)


def test_ids_have_the_documented_shape_and_sort_by_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_764_150_000_000_000_000]
    monkeypatch.setattr(ids.time, "time_ns", lambda: now[0])
    made = []
    for _ in range(50):
        made.append(new_id("run"))
        now[0] += 1_000_000  # one millisecond
    assert all(_ID.match(i) for i in made)
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert made[0][4:13] == _reference_base36(1_764_150_000_000, 9)


def test_random_tail_is_uniform_over_the_alphabet() -> None:
    counts = Counter("".join(new_id("x")[11:] for _ in range(6000)))  # 72,000 chars
    assert set(counts) <= set("0123456789abcdefghijklmnopqrstuvwxyz")
    expected = 72_000 / 36
    chi2 = sum((counts[c] - expected) ** 2 / expected for c in "0123456789abcdefghijklmnopqrstuvwxyz")
    # 35 degrees of freedom: p = 1e-6 at about 84. A `byte % 36` mapping (0-3 favoured by 8/7)
    # scores about 190 on this many characters.
    assert chi2 < 84


def test_a_tail_short_of_accepted_bytes_draws_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes 252-255 are dropped; if too few remain, more are drawn (never a short id)."""
    draws = iter([bytes([255] * 10 + [0] * 6), bytes([1] * 40), bytes([2] * 40)])
    monkeypatch.setattr(ids.os, "urandom", lambda n: next(draws)[:n])
    made = new_id("run")
    assert _ID.match(made)
    assert made.endswith("1" * 12)  # the short first draw is discarded whole


def test_random_token() -> None:
    token = random_token()
    assert re.fullmatch(r"[0-9a-z]{32}", token)
    assert random_token() != token
    assert len(random_token(64)) == 64
