"""Recorded tools: a replay's tool calls answered from its origin's committed results.

Matching rule (docs/time-travel.md): a call matches a recorded call of the origin with the same
tool name and the same canonical arguments (the parsed argument object as JSON with sorted keys
and no insignificant whitespace, so key order and spacing do not matter, values do). Identical
calls are matched in order: the n-th such call of the replay gets the n-th recorded result (each
recorded result answers one call). A matched call gets the recorded status, output or error, the
recorded `update_state` and the recorded `ctx.goto` (the replay goes where its origin went); no
handler, client tool or child run is started. An unmatched call gets a failed result
`TOOL_CALL_NOT_RECORDED` and the loop goes on, unless the replay was made with `unmatched: "live"`
(`replay_tools` = `recorded+live`): then the call runs as in any run.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from typing import Any, Final

import asyncpg

from stevora.db import forks as db_forks
from stevora.db.checkpoints import replay_result_text
from stevora.db.reads.rows import DbRow
from stevora.llm.messages import ToolCall
from stevora.tools import ToolOutcome
from stevora.tools.invoke import parse_arguments

RECORDED = "recorded"  # unmatched calls get TOOL_CALL_NOT_RECORDED
RECORDED_LIVE = "recorded+live"  # unmatched calls run live
NOT_RECORDED: Final = "TOOL_CALL_NOT_RECORDED"


def canonical(name: str, arguments: Any) -> str:
    return name + "\x00" + json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class RecordedTools:
    def __init__(
        self,
        origin_id: str,
        recorded: list[DbRow],
        used: list[DbRow],
        *,
        live: bool = False,
    ) -> None:
        self.origin_id = origin_id
        self.live = live  # unmatched calls run live instead of failing
        self._queues: dict[str, deque[DbRow]] = defaultdict(deque)
        for r in recorded:
            self._queues[canonical(r["tool_name"], r["input_json"])].append(r)
        # This replay's own committed calls (a resumed step): the results they took are taken.
        self.outcomes = [self._take(u) for u in used]

    def _take(self, call: Any) -> str:
        """Replays the matching of an already committed call: 'matched', 'unmatched' (failed with
        TOOL_CALL_NOT_RECORDED) or 'live' (unmatched, run live)."""
        queue = self._queues.get(canonical(call["tool_name"], call["input_json"]))
        if call["error_code"] == NOT_RECORDED:
            return "unmatched"
        if queue:
            queue.popleft()
            return "matched"
        return "live"

    def counts(self) -> dict[str, int]:
        """How the committed calls were answered: matched, unmatched (live ones included), live."""
        matched = self.outcomes.count("matched")
        return {
            "matched": matched,
            "unmatched": len(self.outcomes) - matched,
            "live": self.outcomes.count("live"),
        }

    @classmethod
    async def load(
        cls, pool: asyncpg.Pool, run_id: str, source: tuple[str | None, str | None] | None = None
    ) -> RecordedTools | None:
        """The recording a run answers its tool calls from, or None for a run that runs them live.
        `source`: the run's (replay_of, replay_tools) when the caller has them (else read)."""
        origin, mode = source if source is not None else await db_forks.replay_source(pool, run_id)
        if origin is None or mode not in (RECORDED, RECORDED_LIVE):
            return None
        recorded = await db_forks.recorded_results(pool, origin)
        used = await db_forks.own_tool_calls(pool, run_id)
        return cls(origin, recorded, used, live=mode == RECORDED_LIVE)

    def answer(self, call: ToolCall) -> tuple[ToolOutcome, dict[str, Any] | None, str | None] | None:
        """The recorded outcome for `call`, its recorded state updates and `ctx.goto` target; None
        for an unmatched call of a replay that runs those live (the caller runs it)."""
        arguments, _ = parse_arguments(call.arguments)
        queue = self._queues.get(canonical(call.name, arguments))
        if not queue and self.live:
            return None
        if not queue:
            error = f"No recorded result in run {self.origin_id} for {call.name}({json.dumps(arguments, sort_keys=True)})"
            return (
                ToolOutcome(
                    "failed",
                    arguments,
                    None,
                    error,
                    NOT_RECORDED,
                    0.0,
                    json.dumps({"error": error}),
                ),
                None,
                None,
            )
        r = queue.popleft()
        ok = r["status"] == "completed"
        outcome = ToolOutcome(
            "completed" if ok else "failed",
            arguments,
            r["output_json"],
            r["error"],
            r["error_code"],
            0.0,
            replay_result_text(r),
        )
        return outcome, (r["state_updates"] if ok else None), (r["goto_step"] if ok else None)


async def replay_report(pool: asyncpg.Pool, run_id: str) -> dict[str, int] | None:
    """A replay's tool calls so far: matched, unmatched (live ones included) and live; None for a
    run that is not a replay with recorded tools."""
    recorded = await RecordedTools.load(pool, run_id)
    return None if recorded is None else recorded.counts()
