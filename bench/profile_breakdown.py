"""Python CPU by component, from a py-spy raw profile of `bench.tool_loop`.

    .venv/bin/py-spy record --rate 250 --format raw -o /tmp/spy.txt -- \\
        .venv/bin/python -m bench.tool_loop --rounds 20 --concurrency 32 --repeats 3 --waves 4
    .venv/bin/python -m bench.profile_breakdown /tmp/spy.txt [--checkpoints N]

Only samples taken while the event loop runs a run's task (RunPool._run / submit) or the loop's
own machinery count; start-up, run creation and migrations are left out. Each sample goes to the
component of its innermost recognisable frame (so asyncpg calling the JSON codec counts as JSON).
With `--checkpoints` (the run's model calls + tool calls) it prints µs per checkpoint.
"""

from __future__ import annotations

import argparse
import os
import re
from collections import Counter

# Innermost match wins; order matters only within one frame.
COMPONENTS: list[tuple[str, re.Pattern[str]]] = [
    # In the kernel: loopback send() also runs PostgreSQL's receive path and often hands the CPU
    # to the woken backend, so on a busy machine this bucket includes time spent preempted.
    (
        "syscalls: socket send / epoll_wait",
        re.compile(r"^(_SelectorSocketTransport\.write|EpollSelector\.select) "),
    ),
    ("JSON codec (orjson / json)", re.compile(r"\((orjson|json/|stevora/db/database\.py)")),
    ("transcript repair (prepare_transcript)", re.compile(r"\(stevora/llm/transcript\.py")),
    ("transcript rebuild / messages", re.compile(r"\(stevora/(engine/steps/llm_state|llm/messages)\.py")),
    ("pydantic", re.compile(r"\((pydantic|pydantic_core)/")),
    ("structlog", re.compile(r"\(structlog/")),
    ("asyncpg (protocol, encode/decode, pool)", re.compile(r"\(asyncpg/")),
    (
        "scripted model + tool invoke (bench stand-ins)",
        re.compile(r"\(stevora/(llm/scripted_provider|tools/)"),
    ),
    ("ids / clock", re.compile(r"\(stevora/(ids|clock)\.py")),
    ("engine: driver, run pool, SQL builders", re.compile(r"\(stevora/(engine|db)/")),
    ("engine: other stevora code", re.compile(r"\(stevora/")),
    (
        "event loop (asyncio: tasks, futures, selector)",
        re.compile(r"\((asyncio/|selectors\.py|contextlib\.py)"),
    ),
]
IN_WINDOW = re.compile(r"RunPool\._run|RunPool\.submit|BaseEventLoop\._run_once")
OUTSIDE = re.compile(
    r"create_runs|upgrade_head|LoopBench\.start|bare_transactions|phase_clock|_find_and_load"
)


def classify(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in COMPONENTS:
            if pattern.search(frame):
                return name
    return "other (stdlib, uuid, secrets, ...)"


def breakdown(path: str) -> tuple[Counter[str], int]:
    counts: Counter[str] = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not IN_WINDOW.search(stack) or OUTSIDE.search(stack):
                continue
            counts[classify(stack.split(";"))] += int(n)
            total += int(n)
    return counts, total


def _frame(filename: str, line: int, func: str) -> str:
    short = re.sub(r"^.*/lib/python3\.\d+/", "", filename).split("site-packages/")[-1]
    return f"{func} ({short.split(os.getcwd() + '/')[-1]}:{line})"


def breakdown_pstats(path: str) -> tuple[Counter[str], float]:
    """Seconds of CPU (cProfile with a process-time clock) by component, from each function's own
    time; a builtin's time goes to its callers' components (socket and poll calls stay syscalls)."""
    import pstats

    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    seconds: Counter[str] = Counter()
    for (filename, line, func), (_, _, tottime, _, callers) in stats.items():
        if filename != "~":
            seconds[classify([_frame(filename, line, func)])] += tottime
        elif ("socket" in func and ("send" in func or "recv" in func)) or "poll" in func:
            seconds["syscalls: socket send / epoll_wait"] += tottime
        elif "orjson" in func or "json" in func:
            seconds["JSON codec (orjson / json)"] += tottime
        else:
            total = sum(c[2] for c in callers.values()) or 1.0
            for (cf, cl, cfunc), c in callers.items():
                seconds[classify([_frame(cf, cl, cfunc)])] += tottime * c[2] / total
    return seconds, sum(seconds.values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--checkpoints", type=int, default=0, help="checkpoints written in the window")
    parser.add_argument(
        "--pstats", action="store_true", help="the profile is a cProfile dump (bench.tool_loop --cprofile)"
    )
    args = parser.parse_args()
    if args.pstats:
        secs, total_s = breakdown_pstats(args.profile)
        print(f"cProfile (process CPU clock): {total_s:.2f} s of CPU in the profiled windows")
        for name, sec in secs.most_common():
            us = f"{sec / args.checkpoints * 1e6:8.1f} µs/checkpoint" if args.checkpoints else ""
            print(f"  {name:<50} {100 * sec / total_s:5.1f} %  {us}")
        return
    counts, total = breakdown(args.profile)
    print(f"{total} samples in the timed windows ({total / args.rate:.2f} s of Python CPU)")
    for name, n in counts.most_common():
        us = f"{n / args.rate / args.checkpoints * 1e6:8.1f} µs/checkpoint" if args.checkpoints else ""
        print(f"  {name:<50} {100 * n / total:5.1f} %  {us}")


if __name__ == "__main__":
    main()
