"""Machine-independent counts of what a tool round costs: function calls, statements, round trips,
commits and event-loop wake-ups, counted (not timed) inside a benchmark's window.

Milliseconds and rounds/s depend on the machine (its cores, its load, what a system call costs in
its sandbox); these counts do not, so they are the figures to compare across machines and commits.

* **Function calls** (`sys.setprofile`, the hook cProfile uses): `py` counts Python frames entered
  (a coroutine or generator resumed counts again, as in cProfile), `c` counts calls of builtins
  (`len`, `dict.get`, C methods, asyncpg's and uvloop's compiled code) made from Python code.
  `py + c` is cProfile's "function calls". Calls of code under `bench/` and of the scripted
  provider (the stand-in model) are counted apart as the bench's own.
* **Statements**: every `execute` / `fetch*` / `executemany` on an asyncpg connection (BEGIN and
  COMMIT of an explicit transaction included); **round trips** add one per statement that was not
  in the connection's prepared-statement cache (asyncpg prepares it first); **commits** count
  COMMITs and statements run outside an explicit transaction (each its own implicit one).
* **Wake-ups** (asyncio's loop only, uvloop's is compiled): `selects` is every poll of the
  selector (one per loop iteration), `sleeps` those that could block (nothing was ready).
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import asyncpg

_STATEMENT_METHODS = ("execute", "executemany", "fetch", "fetchrow", "fetchval", "fetchmany")


@dataclass
class Counts:
    py: int = 0
    c: int = 0
    own: int = 0  # bench stand-ins (scripted model, timed provider, the noop tool), py + c
    statements: int = 0
    round_trips: int = 0
    commits: int = 0
    selects: int = 0
    sleeps: int = 0
    by_code: Counter[CodeType] = field(default_factory=Counter)  # Python frames entered, per function
    c_by_code: Counter[CodeType] = field(default_factory=Counter)  # builtin calls, per calling function

    @property
    def calls(self) -> int:
        return self.py + self.c

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.py - other.py,
            self.c - other.c,
            self.own - other.own,
            self.statements - other.statements,
            self.round_trips - other.round_trips,
            self.commits - other.commits,
            self.selects - other.selects,
            self.sleeps - other.sleeps,
            self.by_code - other.by_code,
            self.c_by_code - other.c_by_code,
        )


def _is_own(code: CodeType) -> bool:
    name = code.co_filename
    return "/bench/" in name or name.endswith("scripted_provider.py")


class _CountingSelector:
    """Forwards to the loop's selector, counting polls."""

    def __init__(self, inner: Any, probe: Probe) -> None:
        self._inner = inner
        self._probe = probe

    def select(self, timeout: float | None = None) -> Any:
        self._probe.counts.selects += 1
        if timeout is None or timeout > 0:
            self._probe.counts.sleeps += 1
        return self._inner.select(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Probe:
    """Counts while started; `counts` accumulates over every started window."""

    def __init__(self) -> None:
        self.counts = Counts()
        self.active = False
        self._own: dict[CodeType, bool] = {}
        self._skip: set[CodeType] = set()  # the probe's own wrappers: not counted
        self._saved: list[tuple[Any, str, Any]] = []
        self._loop: Any = None

    # -- function calls -------------------------------------------------------------------------

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" and event != "c_call":
            return
        code = frame.f_code
        if code in self._skip:
            return
        counts = self.counts
        if event == "call":
            counts.py += 1
            counts.by_code[code] += 1
        else:
            counts.c += 1
            counts.c_by_code[code] += 1
        own = self._own.get(code)
        if own is None:
            own = self._own[code] = _is_own(code)
        if own:
            counts.own += 1

    # -- statements -----------------------------------------------------------------------------

    def _wrap_statement(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        probe = self

        async def counted(conn: asyncpg.Connection, query: str, *args: Any, **kwargs: Any) -> Any:
            counts = probe.counts
            counts.statements += 1
            counts.round_trips += 1
            verb = query.lstrip()[:8].upper()
            if verb.startswith("COMMIT"):
                counts.commits += 1
            elif not verb.startswith(("BEGIN", "ROLLBACK")) and not conn._protocol.is_in_transaction():
                counts.commits += 1
            if args or name != "execute":
                key = (query, conn._protocol.get_record_class(), False)
                if key not in conn._stmt_cache._entries:
                    counts.round_trips += 1  # prepared first: Parse/Describe, then Bind/Execute
            return await original(conn, query, *args, **kwargs)

        self._skip.add(counted.__code__)
        return counted

    def start(self) -> None:
        if not self._saved:
            for name in _STATEMENT_METHODS:
                original = getattr(asyncpg.Connection, name)
                self._saved.append((asyncpg.Connection, name, original))
                setattr(asyncpg.Connection, name, self._wrap_statement(name, original))
            loop = asyncio.get_running_loop()
            selector = getattr(loop, "_selector", None)
            if selector is not None:  # asyncio's loop (uvloop has none)
                self._loop = loop
                wrapped = _CountingSelector(selector, self)
                self._skip.add(_CountingSelector.select.__code__)
                self._skip.add(_CountingSelector.__getattr__.__code__)
                loop._selector = wrapped  # type: ignore[attr-defined]
        self.active = True
        sys.setprofile(self._hook)

    def stop(self) -> None:
        sys.setprofile(None)
        self.active = False
        for owner, name, original in self._saved:
            setattr(owner, name, original)
        self._saved.clear()
        if self._loop is not None:
            self._loop._selector = self._loop._selector._inner
            self._loop = None

    @property
    def counts_wakeups(self) -> bool:
        return not type(asyncio.get_event_loop_policy()).__module__.startswith("uvloop")

    def snapshot(self) -> Counts:
        c = self.counts
        return Counts(c.py, c.c, c.own, c.statements, c.round_trips, c.commits, c.selects, c.sleeps)

    def total(self) -> int:
        return self.counts.py + self.counts.c


def top_functions(by_code: Counter[CodeType], rounds: int, n: int = 25) -> list[str]:
    """The `n` Python functions entered most often, per round."""
    lines = []
    for code, calls in by_code.most_common(n):
        where = code.co_filename
        for marker in ("/site-packages/", "/stevora/", "/bench/", "/lib/python3"):
            if marker in where:
                where = where.split(marker, 1)[1]
                break
        lines.append(f"{calls / rounds:8.1f}  {where}:{code.co_firstlineno} {code.co_qualname}")
    return lines


def _area(code: CodeType) -> str:
    name = code.co_filename
    if _is_own(code):
        return "bench stand-ins"
    if "/stevora/" in name:
        rest = name.split("/stevora/", 1)[1]
        parts = rest.split("/")
        return "stevora/" + (
            parts[0] if len(parts) > 1 and parts[0] in ("db", "observability", "tools", "llm") else rest
        )
    if "/site-packages/" in name:
        return name.split("/site-packages/", 1)[1].split("/", 1)[0]
    return "stdlib " + name.rsplit("/", 1)[-1]


def by_area(counts: Counts, rounds: int, n: int = 30) -> list[str]:
    """Calls per round (Python frames + builtin calls made from them) grouped by module or package."""
    areas: Counter[str] = Counter()
    for code, k in counts.by_code.items():
        areas[_area(code)] += k
    for code, k in counts.c_by_code.items():
        areas[_area(code)] += k
    return [f"{k / rounds:8.1f}  {area}" for area, k in areas.most_common(n)]
