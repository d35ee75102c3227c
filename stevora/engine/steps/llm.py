"""`llm`: the model ↔ tool loop, checkpointed at every model call and every tool call.

    rebuild transcript from committed rounds (llm_calls + tool_trace of this step visit)
    loop:
        run the tool calls of the last round that have no trace yet   ← resume point after a crash
        final answer?            → guardrails → StepResult
        over maxToolRounds?      → MAX_TOOL_ROUNDS (the extra request's tools are not executed)
        call the model (fallback chain) → commit llm_calls row + LLM_CALL_COMPLETED (one statement)
        each tool call           → run handler → commit tool_trace row + TOOL_CALL_* (one statement)

The loop is split by concern: `llm_state` (the transcript rebuilt from rows), `llm_model` (model
calls and their checkpoints), `llm_tools` (the tools offered) and `llm_tool_runner` (tool calls
and their checkpoints); this module drives them and
decides how the step ends. A run with a budget is checked before each model and tool call
(`stevora.engine.budget`): a limit reached fails the step or makes it wait. The whole loop stays
inside one worker execution: no broker hop per round (docs/architecture.md, "Many slow LLM calls
in one worker process").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from stevora.db import checkpoints, runs
from stevora.db.checkpoints import CommittedRound
from stevora.definitions import LlmStep
from stevora.engine import budget as budget_rules
from stevora.engine.budget import Meter
from stevora.engine.steps.awaited_kinds import AWAITED_KINDS
from stevora.engine.steps.base import StepExecution, StepType, WaitContext, WaitPlan
from stevora.engine.steps.llm_attachments import ConversationAttachments, InvalidAttachment
from stevora.engine.steps.llm_model import ModelCaller
from stevora.engine.steps.llm_state import LoopState, rebuild, render_prompt, response_message
from stevora.engine.steps.llm_thread import histories_for, take_messages, thread_history, with_history
from stevora.engine.steps.llm_tool_runner import ToolRunner
from stevora.engine.steps.llm_tools import StepTools, first_goto, resolve_tools
from stevora.errors import BudgetExceeded, LeaseLost, ProviderError
from stevora.events import Event, EventType
from stevora.llm import guardrails
from stevora.llm.messages import Message
from stevora.statuses import RunStatus
from stevora.tasks import StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.llm")


class LlmStepRun:
    """One execution of an llm step attempt (fresh or resumed)."""

    def __init__(
        self, rt: Runtime, ex: StepExecution, step: LlmStep, tools: StepTools, meter: Meter | None = None
    ) -> None:
        self.rt = rt
        self.ex = ex
        self.step = step
        self.log = log.bind(workflow_run_id=ex.run_id, step_name=ex.step_name, attempt=ex.attempt)
        self.model = ModelCaller(rt, ex, step, tools.specs, self.log)
        self.model.attachments = ConversationAttachments(
            rt.pool, ex.workspace_id, rt.settings.max_run_attachment_bytes
        )
        self.tools = ToolRunner(rt, ex, step, tools, self.log)
        self._meter(meter)

    @classmethod
    async def start(cls, rt: Runtime, ex: StepExecution, step: LlmStep) -> LlmStepRun:
        # A run with a budget reads its usage once here; each call then checks it in memory.
        meter = await Meter.read(rt.pool, ex.run_id) if ex.budget is not None else None
        return cls(rt, ex, step, await resolve_tools(rt, ex.workspace_id, step, run_id=ex.run_id), meter)

    def _meter(self, meter: Meter | None) -> None:
        self.model.meter = self.tools.meter = meter

    async def run(self) -> StepResult:
        fresh = self.ex.fresh
        while True:
            try:
                return await self._loop(fresh)
            except BudgetExceeded as exc:
                # Read the limits again before stopping: a person may have raised them meanwhile.
                before = self.tools.meter
                meter = await Meter.read(self.rt.pool, self.ex.run_id)
                # Not raised: stop, even with calls left. A round whose approval-gated, client or
                # workflow calls do not all fit stops with calls left, and going on from the same
                # rows would stop there again, for ever (found by tests/e2e/hostile).
                unchanged = before is not None and meter is not None and meter.budget == before.budget
                if meter is not None and (unchanged or meter.still_refused(exc.limit)):
                    return budget_rules.stopped(meter, exc.limit, self.ex.step_name)
                # Raised: go on from the committed rows, as a resumed step would.
                self._meter(meter)
                fresh = False
                self.ex.inbox.pending = True  # messages taken for the refused call go with the next

    async def _loop(self, fresh: bool) -> StepResult:
        prompt = render_prompt(
            self.step,
            self.ex.input,
            self.ex.state,
            max_attachment_bytes=self.rt.settings.max_attachment_bytes,
        )
        rounds = (
            []
            if fresh
            else await checkpoints.load_rounds(self.rt.pool, self.ex.run_id, self.ex.step_name, self.ex.visit)
        )
        # A resumed thread turn: its first call names the history it continued.
        histories = await histories_for(self.rt.pool, rounds, self.ex.step_name) if rounds else None
        st = rebuild(rounds, prompt, histories)
        if not rounds and self.ex.thread_id is not None:  # a thread turn: earlier turns first
            with_history(st, await thread_history(self.rt, self.ex))
        if rounds:
            self.tools.steered = True  # a committed round may hold a goto the lost execution did not follow
        msg: Message | None = None  # the last round's assistant turn, once built
        while True:
            last = st.rounds[-1] if st.rounds else None
            if last is not None:
                if msg is None:
                    msg = response_message(last.response)
                calls = msg.tool_calls
                if calls and st.tool_rounds > self.step.max_tool_rounds:
                    return await self._max_rounds(st, last)
                if calls:
                    waiting = await self.tools.run_missing(st, last, calls)
                    if waiting is not None:
                        return waiting
                    goto = first_goto(last, calls) if self.tools.steered else None
                    if goto is not None:  # a handler called ctx.goto: the step ends with this round
                        return self._goto(st, last, msg, goto)
                else:
                    result = await self._finish(st, last)
                    if result is not None:
                        return result
            await take_messages(self.rt, self.ex, st)  # steered messages, at the round boundary
            round_ = await self.model.call(st)
            st.rounds.append(round_)
            msg = response_message(round_.response)  # reused at the top of the loop
            st.transcript.append(msg)
            if msg.tool_calls:
                st.tool_rounds += 1

    # -- endings ----------------------------------------------------------------------------

    def _goto(self, st: LoopState, last: CommittedRound, msg: Message, goto: tuple[int, str]) -> StepResult:
        """A tool went to another step: the round's results are committed, the model is not asked
        again, and the driver goes on at the target (stevora.engine.advancing), skipping the steps
        between on a forward jump. The step's output says who sent it where; no outputKey is written."""
        index, target = goto
        call = msg.tool_calls[index]
        allowed = self.step.goto_targets
        if allowed is not None and target not in allowed:
            return StepResult(
                status="failed",
                retryable=False,
                error={
                    "code": "GOTO_NOT_ALLOWED",
                    "message": f"Tool '{call.name}' went to step '{target}', which is not in this step's "
                    f"gotoTargets ({', '.join(allowed) or 'none'})",
                    "details": {"gotoStep": target, "toolName": call.name, "toolCallId": call.id},
                },
            )
        output = self._output(st, msg.content or "", last)
        output["goto"] = {"step": target, "toolName": call.name, "toolCallId": call.id, "round": last.round}
        return StepResult(output=output, next_step=target)

    async def _max_rounds(self, st: LoopState, last: CommittedRound) -> StepResult:
        limit = self.step.max_tool_rounds
        if self.step.on_max_tool_rounds == "complete":
            text = next(
                (m.content for m in reversed(st.transcript) if m.role == "assistant" and m.content), ""
            )
            return self._result(st, text or "", None, last, stopped_at_limit=True)
        return StepResult(
            status="failed",
            retryable=False,
            error={
                "code": "MAX_TOOL_ROUNDS",
                "message": f"The model still asked for tools after {limit} tool rounds",
                "details": {
                    "maxToolRounds": limit,
                    "requestedTools": [c["name"] for c in last.response.get("toolCalls") or ()],
                },
            },
        )

    async def _finish(self, st: LoopState, last: CommittedRound) -> StepResult | None:
        text = last.response.get("text") or ""
        parsed = guardrails.parse_output(text, self.step)
        violations = guardrails.check(self.step, text, parsed)
        if not violations:
            return self._result(st, text, parsed.value, last)
        config = self.step.guardrails
        action = config.on_failure if config is not None else "block"
        if (
            action == "retry_with_feedback"
            and config is not None
            and st.feedback_attempts >= config.max_feedback_attempts
        ):
            action = "block"
        await self._guardrail_event(violations, action, last)
        if action == "warn":
            return self._result(st, text, parsed.value, last, warnings=[v.to_dict() for v in violations])
        if action == "retry_with_feedback":
            st.feedback_attempts += 1
            st.pending_append = [Message.user(guardrails.feedback_message(violations))]
            return None
        return StepResult(
            status="failed",
            retryable=False,
            error={
                "code": "GUARDRAIL_FAILED",
                "message": "; ".join(v.message for v in violations),
                "details": {"violations": [v.to_dict() for v in violations]},
            },
        )

    async def _guardrail_event(
        self, violations: list[guardrails.Violation], action: str, last: CommittedRound
    ) -> None:
        async with self.rt.pool.acquire() as conn, conn.transaction():
            if await checkpoints.guardrail_failure_recorded(conn, self.ex.step_run_id, last.round):
                return  # written before a crash; the run resumed at the same final answer
            await runs.update_run(
                conn,
                self.ex.run_id,
                expect=[RunStatus.RUNNING],
                owner=self.ex.owner,
                events=[
                    Event(
                        EventType.GUARDRAIL_FAILED,
                        {
                            "stepName": self.ex.step_name,
                            "round": last.round,
                            "action": action,
                            "violations": [v.to_dict() for v in violations],
                        },
                        self.ex.step_run_id,
                    )
                ],
            )

    def _result(
        self,
        st: LoopState,
        text: str,
        value: Any,
        last: CommittedRound,
        *,
        stopped_at_limit: bool = False,
        warnings: list[dict[str, Any]] | None = None,
    ) -> StepResult:
        result = value if value is not None else text
        output = self._output(st, text, last)
        if value is not None:
            output["json"] = value
        if stopped_at_limit:
            output["stoppedAtMaxToolRounds"] = True
        if warnings:
            output["guardrailWarnings"] = warnings
        return StepResult(output=output, state_updates={self.step.effective_output_key(): result})

    def _output(self, st: LoopState, text: str, last: CommittedRound) -> dict[str, Any]:
        return {
            "text": text,
            "model": last.model,
            "provider": last.provider,
            "rounds": len(st.rounds),
            "toolRounds": min(st.tool_rounds, self.step.max_tool_rounds),
            "costUsd": st.cost_usd,
            "usage": {"inputTokens": st.usage.input_tokens, "outputTokens": st.usage.output_tokens},
        }


class LlmStepType(StepType):
    name = "llm"

    async def execute(self, rt: Runtime, ex: StepExecution, step: LlmStep) -> StepResult:
        try:
            return await (await LlmStepRun.start(rt, ex, step)).run()
        except LeaseLost:
            raise
        except ProviderError as exc:
            return StepResult(
                status="failed",
                error={**exc.to_dict(), "message": f"All models failed; last error: {exc.message}"},
                retryable=exc.retryable,
            )
        except InvalidAttachment as exc:  # an image or file that cannot be sent: no retry changes it
            return StepResult(status="failed", error=exc.to_dict(), retryable=False)

    async def on_waiting(self, wait: WaitContext, result: StepResult) -> WaitPlan:
        """Record the calls handed over, in the transaction that makes the step WAITING: each
        kind writes what its calls need (stevora.engine.steps.awaited_kinds)."""
        return await AWAITED_KINDS.hand_over(wait, result)

    async def on_due(self, wait: WaitContext) -> StepResult | None:
        """The earliest deadline of a handed-over call passed: its kind says what that means (a
        client tool's `timeoutMs` fails the call, its `outputsExpireAfterMs` the run)."""
        return await AWAITED_KINDS.on_due(wait)
