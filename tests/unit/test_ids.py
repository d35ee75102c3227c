"""ids: the format, the time prefix's order, a uniform random tail (no modulo bias)."""

from __future__ import annotations

import os
import re
import threading
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
    """Bytes 252-255 are dropped; if too few remain, more are drawn (never a short tail)."""
    draws = iter([bytes([255] * 4000 + [0] * 100), bytes([1] * 4000), bytes([2] * 5000)])
    monkeypatch.setattr(ids.os, "urandom", lambda n: next(draws)[:n])
    monkeypatch.setattr(ids, "_tails", [])
    made = [new_id("run") for _ in range(ids._BATCH)]  # one batch: the first two draws
    assert all(_ID.match(i) for i in made)
    tails = [i[13:] for i in made]
    assert sorted(set(tails)) == ["000000000000", "000011111111", "111111111111"]
    assert tails.count("000000000000") == 8  # the 100 accepted bytes of the first draw, in order
    assert _ID.match(new_id("run")) and ids._tails  # the next id starts the next batch (third draw)


def test_every_tail_is_handed_out_once_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids, "_tails", [])
    made: list[list[str]] = [[] for _ in range(8)]

    def make(out: list[str]) -> None:
        for _ in range(3 * ids._BATCH):
            out.append(new_id("x")[11:])

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tails = [t for out in made for t in out]
    assert len(tails) == 24 * ids._BATCH and len(set(tails)) == len(tails)


def test_a_forked_child_does_not_reuse_its_parents_tails() -> None:
    new_id("x")
    assert ids._tails  # the parent holds unused tails
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it holds, then the tail it makes
        os.close(read)
        os.write(write, f"{len(ids._tails)} {new_id('x')[11:]}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        held, tail = f.read().split()
    os.waitpid(pid, 0)
    assert held == "0"
    assert tail not in ids._tails


def test_random_token() -> None:
    token = random_token()
    assert re.fullmatch(r"[0-9a-z]{32}", token)
    assert random_token() != token
    assert len(random_token(64)) == 64
