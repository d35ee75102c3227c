"""Running the tool calls of an `llm` step's round, in named parts.

A round's calls that have no trace yet go through, in this order:
1. replay (`_replay`): a replay with recorded tools answers calls from its origin's results;
2. sorting (`_sort`): a call of a tool the step does not offer is refused at once (never looked
   up or run); the others run here, wait for a gate, or are answered from outside;
3. gating (`_open_gates`): a gated call a person already approved runs here, with the approved
   arguments; the others are handed over to their gate;
4. budget (`_fit_budget`): with `maxToolCalls`, handler calls run in the model's order up to the
   limit and nothing is handed over;
5. execution (`_run_here`): the handler calls, in parallel when the step allows it; each is
   committed with its event in one statement (`tool_trace` + `TOOL_CALL_*`). A committed call
   never runs again; a handler that ran but whose commit did not happen runs again with the
   same idempotency key (`tool_calls.tool_call_key`): at-least-once handlers, exactly-once records;
6. hand-over (`_hand_over`): each call's kind makes its awaited row (or refuses it at once),
   and the step returns a waiting result (stevora.engine.steps.awaited_kinds).
Handlers see the run through `ToolContext` (input, a state snapshot) and may `update_state`.
"""

from __future__ import annotations

import asyncio
from operator import itemgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import structlog

from stevora.db import awaited as db_awaited
from stevora.db.awaited import NewAwaitedCall
from stevora.db.budgets import UNCOUNTED_TOOL_ERROR
from stevora.db.checkpoints import CommittedRound
from stevora.db.database import storable_text
from stevora.definitions import LlmStep
from stevora.engine.budget import Meter
from stevora.engine.steps import llm_mcp
from stevora.engine.steps.awaited.kind import HandingOver
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.llm_recorded import RecordedTools
from stevora.engine.steps.llm_state import LoopState
from stevora.engine.steps.llm_tools import StepTools
from stevora.engine.steps.tool_calls import (
    TOOL_CALL_ID_WIDTH,
    CallSlot,
    column_text,
    failed_call,
    output_limits,
    record_outcome,
)
from stevora.engine.store import WorkspaceStore
from stevora.errors import BudgetExceeded
from stevora.llm.messages import Message, ToolCall
from stevora.observability import hooks as observe
from stevora.statuses import AwaitedStatus
from stevora.tasks import StepResult
from stevora.tools import DeclaredSchemas, ToolContext, ToolOutcome, invoke_tool, schema_problems
from stevora.tools.invoke import parse_arguments

if TYPE_CHECKING:
    from stevora.runtime import Runtime

_UNREAD = object()
_INDEX = itemgetter(0)
Indexed = list[tuple[int, ToolCall]]  # calls with their index in the round


class Sorted:
    """A round's untraced calls by who answers them."""

    __slots__ = ("approved", "gated", "here", "outside")

    def __init__(self) -> None:  # one call per round, not one per field (`bench/tool_loop.py` counts)
        self.here: Indexed = []  # handler calls, run in the loop
        self.gated: Indexed = []  # handler calls that wait for a gate first
        self.outside: Indexed = []  # calls handed over to an awaited kind
        self.approved: dict[int, Any] = {}  # index → the arguments a person approved


class ToolRunner:
    """Runs the tool calls of a committed round that have no trace yet."""

    def __init__(
        self,
        rt: Runtime,
        ex: StepExecution,
        step: LlmStep,
        tools: StepTools,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.rt = rt
        self.ex = ex
        self.step = step
        self.tools = tools
        self.log = log
        self.state = dict(ex.state)  # the run's state as this step's tools have left it
        self.store = WorkspaceStore(rt.pool, ex.workspace_id)  # what `ctx.store` reads
        self._observe = observe.ToolCalls(ex.step_run_id)  # metric children bound once per visit
        self.meter: Meter | None = None  # the run's budget, when it has one
        self.limits = output_limits(rt.settings)
        self._declared_by_name: dict[str, DeclaredSchemas] = {}
        # A replay with recorded tools answers calls from its origin's results (read on first use).
        self.recorded: RecordedTools | object | None = _UNREAD
        # The round's conversation and its length, which `ctx.transcript` reads (and `ctx.goto` needs).
        self.steering: tuple[list[Message], int] = ([], 0)
        # Whether a round may hold a goto: a call of this execution went somewhere, or the step
        # resumed from committed rounds. Until then the loop does not look (`first_goto`).
        self.steered = False

    async def run_missing(
        self, st: LoopState, last: CommittedRound, calls: tuple[ToolCall, ...]
    ) -> StepResult | None:
        """Run the round's untraced handler calls; hand the others over. Returns a waiting
        StepResult when some calls are now answered from outside, else None (all traced)."""
        missing = [(i, c) for i, c in enumerate(calls) if i not in last.tool_results]
        if not missing:
            return None
        self.steering = (st.transcript, len(st.transcript))
        by_index: dict[int, dict[str, Any]] = {}
        if self.recorded is not None:  # unread yet, or a replay
            missing = await self._replay(last, missing, by_index)
        if missing:
            by_who = await self._sort(last, missing, by_index)
            if by_who.gated:
                await self._open_gates(last, by_who)
            over_budget = self.meter is not None and self._fit_budget(self.meter, by_who)
            await self._run_here(last, by_who, by_index)
            if over_budget:
                raise BudgetExceeded("maxToolCalls")
            handed = await self._hand_over(last, by_who.outside, by_index) if by_who.outside else None
            if handed:
                return self.tools.kinds.waiting(handed, self.tools.entries)
        self._deliver(st, calls, last, by_index)
        return None

    # -- the parts, in order ------------------------------------------------------------------

    async def _replay(
        self, last: CommittedRound, missing: Indexed, by_index: dict[int, dict[str, Any]]
    ) -> Indexed:
        """A replay with recorded tools: record the calls its origin's results answer; returns
        the calls left (unmatched ones the replay runs live, as in any run)."""
        if self.recorded is _UNREAD:
            self.recorded = await RecordedTools.load(self.rt.pool, self.ex.run_id, self.ex.replay)
        if not isinstance(self.recorded, RecordedTools):
            return missing
        live = []
        for index, call in missing:
            answer = self.recorded.answer(call)
            if answer is None:
                live.append((index, call))
            else:
                by_index[index] = await self._record(last, index, call, *answer)
        return live

    async def _sort(
        self, last: CommittedRound, missing: Indexed, by_index: dict[int, dict[str, Any]]
    ) -> Sorted:
        """One pass sorts the calls: not offered (recorded at once, never run), run here, gated,
        answered from outside."""
        offered, gated = self.tools.offered, self.tools.gated
        by_who = Sorted()
        for index, call in missing:
            name = call.name
            if name not in offered:  # never looked up in the registry, never gated, never run
                by_index[index] = await self._record(last, index, call, self._not_offered(call))
            elif offered[name] is not None:
                by_who.outside.append((index, call))
            elif name in gated:
                by_who.gated.append((index, call))
            else:
                by_who.here.append((index, call))
        return by_who

    async def _open_gates(self, last: CommittedRound, by_who: Sorted) -> None:
        """A gated call approved already runs here with its approved arguments; the others wait."""
        decided = {
            row["sequence"]: row
            for row in await db_awaited.for_step_run(self.rt.pool, [last.step_run_id])
            if row["llm_call_id"] == last.llm_call_id and row["status"] == AwaitedStatus.APPROVED
        }
        for index, call in by_who.gated:
            if index in decided:
                by_who.approved[index] = decided[index]["approved_arguments"]
                by_who.here.append((index, call))
            else:
                by_who.outside.append((index, call))
        by_who.here.sort(key=_INDEX)  # the model's order

    def _fit_budget(self, meter: Meter, by_who: Sorted) -> bool:
        """With a `maxToolCalls` the round does not fit: handler calls run in the model's order up
        to the limit and nothing is handed over (a step cannot wait for outputs and for a budget
        at once). True: the rest wait, or fail (BudgetExceeded once these are recorded)."""
        left = meter.tool_calls_left()
        if left is None or len(by_who.here) + len(by_who.outside) <= left:
            return False
        by_who.here, by_who.outside = by_who.here[:left], []
        return True

    async def _run_here(
        self, last: CommittedRound, by_who: Sorted, by_index: dict[int, dict[str, Any]]
    ) -> None:
        here, approved = by_who.here, by_who.approved
        if self.step.parallel_tool_calls and len(here) > 1:
            results = await asyncio.gather(*(self._run_tool(last, i, c, approved.get(i)) for i, c in here))
            by_index.update(zip((i for i, _ in here), results, strict=True))
        else:
            for index, call in here:
                by_index[index] = await self._run_tool(
                    last, index, call, approved[index] if index in approved else None
                )

    async def _hand_over(
        self, last: CommittedRound, outside: Indexed, by_index: dict[int, dict[str, Any]]
    ) -> list[NewAwaitedCall]:
        """Each call's kind makes its awaited row; a call it refuses (or whose arguments do not
        match the tool's schema) is recorded at once as a failed call the model gets."""
        handed: list[NewAwaitedCall] = []
        for index, call in sorted(outside, key=_INDEX):
            new_or_failure = await self._handing_over(last, index, call)
            if isinstance(new_or_failure, NewAwaitedCall):
                handed.append(new_or_failure)
            else:
                by_index[index] = await self._record(last, index, call, new_or_failure)
        return handed

    # -- one call -----------------------------------------------------------------------------

    async def _handing_over(
        self, last: CommittedRound, index: int, call: ToolCall
    ) -> NewAwaitedCall | ToolOutcome:
        arguments, is_object = parse_arguments(call.arguments)
        schema = self.tools.declared.get(call.name)
        if schema is None:  # a gated registered tool: its registered schema
            schema = self._registered_parameters(call.name)
        if is_object and schema is not None:
            problems = schema_problems(schema, arguments)
            if problems:
                return failed_call(
                    arguments,
                    "INVALID_ARGUMENTS",
                    f"Invalid arguments for tool '{call.name}': {'; '.join(problems)}",
                )
        # A gate comes first: a tool both gated and answered from outside is approved first.
        kind = self.tools.gated.get(call.name) or self.tools.offered[call.name]
        assert kind is not None  # sorted as answered from outside, or gated
        new = NewAwaitedCall(
            llm_call_id=last.llm_call_id,
            step_run_id=last.step_run_id,
            round=last.round,
            sequence=index,
            tool_call_id=column_text(call.id, TOOL_CALL_ID_WIDTH),
            tool_name=call.name,  # offered: a valid tool name
            arguments=arguments,
            kind=kind,
        )
        tool = self.tools.entries.get(call.name)
        handing = HandingOver(self.rt, self.ex, self.step, tool, schema, new, last.committed_at)
        return await self.tools.kinds.by_kind[kind].prepare(handing)

    def _deliver(
        self,
        st: LoopState,
        calls: tuple[ToolCall, ...],
        last: CommittedRound,
        by_index: dict[int, dict[str, Any]],
    ) -> None:
        # The model sees results in its own call order, whatever order they finished in.
        for index, call in enumerate(calls):
            if index in by_index:
                trace = by_index[index]
                last.tool_results[index] = trace
                st.transcript.append(
                    Message.tool_result(
                        call.id, trace["text"], name=call.name, is_error=trace["status"] != "completed"
                    )
                )

    def _not_offered(self, call: ToolCall) -> ToolOutcome:
        arguments, _ = parse_arguments(call.arguments)
        offered = ", ".join(sorted(self.tools.offered)) or "none"
        # repr() so an empty, blank or look-alike name is visible as what it is.
        return failed_call(
            arguments,
            "TOOL_NOT_OFFERED",
            f"Tool {call.name[:80]!r} is not offered in this step (offered: {offered})",
        )

    def _declared(self, name: str) -> DeclaredSchemas:
        """The step's own schemas for the tool, made once per visit."""
        declared = DeclaredSchemas(self.tools.declared.get(name), self.tools.output_schemas.get(name))
        self._declared_by_name[name] = declared
        return declared

    def _registered_parameters(self, name: str) -> dict[str, Any] | None:
        registered = self.rt.tools.get(name)
        return dict(registered.parameters) if registered is not None else None

    async def _run_tool(
        self, call_round: CommittedRound, index: int, call: ToolCall, approved_arguments: Any = None
    ) -> dict[str, Any]:
        slot = CallSlot(
            call_round.step_run_id, call_round.llm_call_id, call_round.round, index, call.id, call.name
        )
        ctx = ToolContext(
            idempotency_key=slot.key,
            workflow_run_id=self.ex.run_id,
            workspace_id=self.ex.workspace_id,
            step_run_id=self.ex.step_run_id,
            step_name=self.ex.step_name,
            round=call_round.round,
            call_index=index,
            tool_call_id=call.id,
            run_input=MappingProxyType(self.ex.input),
            state=MappingProxyType(dict(self.state)),
            _steering=self.steering,  # `ctx.goto`, `ctx.transcript`: shared by the round, nothing copied
            _store_backend=self.store,  # `ctx.store`, built only when a handler reads it
        )
        timeout_ms = self.tools.timeouts_ms.get(call.name, self.step.tool_timeout_ms)
        arguments = approved_arguments if approved_arguments is not None else call.arguments
        mcp_tool = self.tools.mcp.get(call.name)
        if mcp_tool is not None:  # an MCP server's tool: a source of its own, recorded the same way
            with self._observe.call(call.name, call.id, call_round.round, arguments) as obs:
                outcome = await llm_mcp.call(self.rt, mcp_tool, parse_arguments(arguments)[0], ctx)
                obs.finished(outcome)
            return await self._record(call_round, index, call, outcome, slot=slot)
        with self._observe.call(call.name, call.id, call_round.round, arguments) as obs:
            outcome = await invoke_tool(
                self.rt.tools,
                call.name,
                arguments,
                context=ctx,
                timeout_s=timeout_ms / 1000,
                limits=self.limits,
                declared=self._declared_by_name.get(call.name) or self._declared(call.name),
            )
            obs.finished(outcome)
        faults = self.rt.faults
        if faults.armed:
            faults.reached("tool_returned", call_round.round, index)
        if outcome.status != "completed":  # `outcome.ok`, inlined
            return await self._record(call_round, index, call, outcome, slot=slot)
        return await self._record(
            call_round,
            index,
            call,
            outcome,
            ctx.state_updates,
            ctx._goto_step,
            slot=slot,
            store=ctx.store_writes,
        )

    async def _record(
        self,
        call_round: CommittedRound,
        index: int,
        call: ToolCall,
        outcome: ToolOutcome,
        state_updates: dict[str, Any] | None = None,
        goto_step: str | None = None,
        *,
        slot: CallSlot | None = None,
        store: list[tuple[str, str, dict[str, Any] | None]] | None = None,
    ) -> dict[str, Any]:
        if goto_step is not None:
            goto_step = storable_text(goto_step)
            self.steered = True
        if slot is None:
            slot = CallSlot(
                call_round.step_run_id, call_round.llm_call_id, call_round.round, index, call.id, call.name
            )
        await record_outcome(
            self.rt,
            self.ex,
            slot,
            outcome,
            state_updates=state_updates,
            goto_step=goto_step,
            store_writes=store,
        )
        self.state.update(state_updates or {})
        if self.meter is not None and outcome.error_code != UNCOUNTED_TOOL_ERROR:
            self.meter.tool_calls += 1
        faults = self.rt.faults
        if faults.armed:
            faults.reached("tool_committed", call_round.round, index)
        # As the trace keeps it (a handler may echo a lone surrogate the model sent): the transcript
        # this execution goes on with is the one a resumed one rebuilds, and the SDK can encode it.
        return {"status": outcome.status, "text": storable_text(outcome.result_text), "goto_step": goto_step}
