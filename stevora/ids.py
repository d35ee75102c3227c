"""Prefixed, sortable, random ids (`wfrun_...`).

A millisecond timestamp prefix keeps ids roughly time-ordered (good B-tree locality);
the random tail makes them unguessable across workspaces.

A tool round makes several ids, so this is on the hot path: no per-character loop. The time part
is computed once per millisecond from a table of base-36 digit pairs; the random tail maps
operating-system random bytes onto the alphabet in one `bytes.translate`, dropping the four byte
values above 251 (7 * 36 - 1) so that every character is uniform (no modulo bias).
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
_TAIL_BYTES = 16  # 12 needed, each kept with p = 252/256: short in fewer than 1 in 200,000 ids

_last_stamp: tuple[int, str] = (-1, "")  # (millisecond, its 9 base-36 chars)


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


def new_id(prefix: str) -> str:
    """`<prefix>_` + 9 base-36 chars of milliseconds + 12 random base-36 chars."""
    global _last_stamp
    ms = time.time_ns() // 1_000_000
    last = _last_stamp
    if last[0] == ms:
        stamp = last[1]
    else:
        stamp = _stamp(ms)
        _last_stamp = (ms, stamp)
    tail = os.urandom(_TAIL_BYTES).translate(_TO_ALPHABET, _REJECTED)
    if len(tail) < _TAIL_CHARS:
        return f"{prefix}_{stamp}{_random_chars(_TAIL_CHARS)}"
    return f"{prefix}_{stamp}{tail[:_TAIL_CHARS].decode()}"


def random_token(n_chars: int = 32) -> str:
    """Lowercase alphanumeric secret, as in `stv_<32 chars>`."""
    return _random_chars(n_chars)
