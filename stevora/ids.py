"""Prefixed, sortable, random ids (`wfrun_...`).

A millisecond timestamp prefix keeps ids roughly time-ordered (good B-tree locality);
the random tail makes them unguessable across workspaces.

A tool round makes several ids, so this is on the hot path: an id is one clock read, one
`list.pop` and a string format. The time part is computed once per millisecond from a table of
base-36 digit pairs. Random tails are drawn from the operating system's CSPRNG in batches of
`_BATCH`: `os.urandom` bytes mapped onto the alphabet in one `bytes.translate` that drops the four
byte values above 251 (7 * 36 - 1), so that every character is uniform (no modulo bias), cut into
12-character tails kept in a list. `list.pop` hands each tail out once, also between threads (it
is atomic); a child process made by `fork` starts with an empty list, never its parent's tails.
"""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
_PAIRS = tuple(a + b for a in _ALPHABET for b in _ALPHABET)  # "00" .. "zz": 1296 entries
# byte b < 252 -> _ALPHABET[b % 36]; bytes 252..255 are deleted by the translate call.
_TO_ALPHABET = bytes.maketrans(bytes(range(252)), (_ALPHABET * 7).encode())
_REJECTED = bytes(range(252, 256))
_TAIL_CHARS = 12  # 36**12 ≈ 2**62: the entropy of the former 62 random bits
_BATCH = 256  # tails drawn at once (3,072 characters from about 3,200 random bytes)

_last_stamp: tuple[int, str] = (-1, "")  # (millisecond, its 9 base-36 chars)
_tails: list[str] = []  # unused random tails; each is popped exactly once


def _stamp(ms: int) -> str:
    """9 base-36 chars of `ms` (zero-padded; wraps after 36**9 ms, in the year 5188)."""
    return (
        _ALPHABET[ms // 36**8 % 36]
        + _PAIRS[ms // 36**6 % 1296]
        + _PAIRS[ms // 36**4 % 1296]
        + _PAIRS[ms // 1296 % 1296]
        + _PAIRS[ms % 1296]
    )


def _random_chars(n: int) -> str:
    """`n` uniformly random base-36 chars from the operating system's CSPRNG."""
    chars = os.urandom(n + n // 3 + 4).translate(_TO_ALPHABET, _REJECTED)
    while len(chars) < n:
        chars += os.urandom(n).translate(_TO_ALPHABET, _REJECTED)
    return chars[:n].decode()


def _refill() -> None:
    chars = _random_chars(_BATCH * _TAIL_CHARS)
    _tails.extend([chars[i : i + _TAIL_CHARS] for i in range(0, len(chars), _TAIL_CHARS)])


def new_id(prefix: str) -> str:
    """`<prefix>_` + 9 base-36 chars of milliseconds + 12 random base-36 chars."""
    global _last_stamp
    ms = time.time_ns() // 1_000_000
    last = _last_stamp
    if last[0] == ms:
        stamp = last[1]
    else:  # `_stamp(ms)`, inlined: at concurrency 1 most ids start a new millisecond
        stamp = (
            _ALPHABET[ms // 36**8 % 36]
            + _PAIRS[ms // 36**6 % 1296]
            + _PAIRS[ms // 36**4 % 1296]
            + _PAIRS[ms // 1296 % 1296]
            + _PAIRS[ms % 1296]
        )
        _last_stamp = (ms, stamp)
    try:
        tail = _tails.pop()
    except IndexError:  # once per `_BATCH` ids
        tail = _fresh_tail()
    return f"{prefix}_{stamp}{tail}"


def _fresh_tail() -> str:
    while True:
        _refill()
        try:
            return _tails.pop()
        except IndexError:  # other threads took the whole batch meanwhile: draw again
            continue


def random_token(n_chars: int = 32) -> str:
    """Lowercase alphanumeric secret, as in `stv_<32 chars>`."""
    return _random_chars(n_chars)


if hasattr(os, "register_at_fork"):  # a forked child must not hand out its parent's tails again
    os.register_at_fork(after_in_child=_tails.clear)
