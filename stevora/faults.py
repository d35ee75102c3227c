"""Named crash points for recovery tests (off unless `STEVORA_FAULT_INJECTION` is set).

`STEVORA_FAULT_INJECTION="tool_returned:3:0"` makes the worker SIGKILL itself the first time it
reaches that point: `<point>[:<round>[:<call index>]]`. Points:

* `llm_call_committed` — right after a model call's llm_calls row + event commit
* `context_compacted`  — right after a `compact` checkpoint (its row + CONTEXT_COMPACTED) commits
* `tool_returned`      — a tool handler returned, its trace is not committed yet
* `tool_committed`     — right after a tool trace + event commit
* `step_started`       — a step run just went RUNNING (before its handler runs)
* `llm_call_starting`  — about to send a round's model request (`:<round>`)
* `parent_told`        — a child run's ending committed its parent's tool result (or its map
                         item's result and the next item's child run, not yet recorded on the
                         parent); none of the runs it woke has been dispatched yet
* `wait_committed`     — a step went WAITING (`:<step type>`), e.g. a `map` step with its first
                         child runs created; none of them (nor its timer) dispatched yet
* `map_collecting`     — a `map` step's due wait is collecting its items' results, before the
                         step completes (in the transaction: the kill rolls it back)
* `batch_sending`      — group commit (`:<kind>[:<n>]`, kind `llm_call`, `tool_trace` or
                         `completion` (runs' endings), the n-th batch of several runs' rows):
                         callers queued, the batch not sent
* `batch_sent`         — the batch statement is handed to its connection, its result not read
* `batch_committed`    — the batch committed, none of its callers woken yet
* `fork_writing`       — a fork's transaction (docs/time-travel.md) has written its run, step runs
                         and model calls; its tool traces and events are not written, nothing
                         is committed

Production never sets it; the cost when unset is one attribute check per checkpoint (per batch).
"""

from __future__ import annotations

import os
import signal


class FaultPlan:
    def __init__(self, spec: str | None) -> None:
        self.point: str | None = None
        self.args: tuple[str, ...] = ()
        if spec:
            parts = spec.split(":")
            self.point, self.args = parts[0], tuple(parts[1:])

        # An attribute, not a property: hot paths check it before calling `reached`.
        self.armed: bool = self.point is not None

    def reached(self, point: str, *args: object) -> None:
        if self.point != point:
            return
        if any(str(a) != want for a, want in zip(args, self.args, strict=False)):
            return
        os.kill(os.getpid(), signal.SIGKILL)
