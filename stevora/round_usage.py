"""One model call's usage as the run page's waterfall and `stevora runs show` print it (one
wording for both): `in 12.3k · cached 11.9k (97%) · ctx 12.5k`.

`in`: the input tokens the provider counted; `cached`: the part of them read from its prompt
cache; `ctx`: the context the call leaves (input + output: what the next round starts from).
"""

from __future__ import annotations


def round_usage(input_tokens: int, cache_read_tokens: int, output_tokens: int) -> str:
    share = f" ({100 * cache_read_tokens / input_tokens:.0f}%)" if input_tokens else ""
    context = input_tokens + output_tokens
    return f"in {_k(input_tokens)} · cached {_k(cache_read_tokens)}{share} · ctx {_k(context)}"


def _k(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)
