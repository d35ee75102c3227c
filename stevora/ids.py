"""Prefixed, sortable, random ids (`wfrun_...`).

A millisecond timestamp prefix keeps ids roughly time-ordered (good B-tree locality);
the random tail makes them unguessable across workspaces.
"""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 36)
        out.append(_ALPHABET[r])
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    """`<prefix>_` + 9 base-36 chars of milliseconds + 12 random base-36 chars."""
    ms = int(time.time() * 1000)
    return f"{prefix}_{_base36(ms, 9)}{_base36(secrets.randbits(62), 12)}"


def random_token(n_chars: int = 32) -> str:
    """Lowercase alphanumeric secret, as in `stv_<32 chars>`."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(n_chars))
