"""The `llm` step: the model ↔ tool loop, checkpointed at every model call and every tool call.

    rebuild transcript from committed rounds (llm_calls + tool_trace of this step visit)
    loop:
        run the tool calls of the last round that have no trace yet   ← resume point after a crash
        final answer?            → guardrails → StepResult
        over maxToolRounds?      → MAX_TOOL_ROUNDS (the extra request's tools are not executed)
        call the model (fallback chain) → commit llm_calls row + LLM_CALL_COMPLETED (one statement)
        each tool call           → run handler → commit tool_trace row + TOOL_CALL_* (one statement)

A committed round is never sent to the model again and a committed tool call never runs again;
a tool handler that ran but whose commit did not happen runs again, with the same idempotency key
(`<stepRunId>:<round>:<callIndex>`). Handlers are at-least-once, records are exactly-once.
The whole loop stays inside one worker execution: no broker hop per round (DESIGN §7).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from stevora.db import checkpoints
from stevora.db.checkpoints import CommittedRound, LlmCallRecord, ToolTraceRecord
from stevora.definitions import LlmStep, LlmToolDef
from stevora.engine import store
from stevora.engine.handlers import StepResult
from stevora.engine.templating import render_template
from stevora.errors import LeaseLost, ProviderError, ProviderNotFound, StevoraError
from stevora.llm import guardrails
from stevora.llm.messages import LlmRequest, LlmResponse, Message, ToolCall, ToolSpec, Usage, tool_choice_of
from stevora.llm.provider import Provider
from stevora.llm.transcript import prepare_transcript
from stevora.tools import ToolContext, invoke_tool

if TYPE_CHECKING:
    from stevora.engine.executors import StepExecution
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.llm")


@dataclass(slots=True)
class StepTools:
    specs: list[ToolSpec]
    declared: dict[str, dict[str, Any]]  # inline schemas, validated against before the handler runs


def resolve_tools(rt: Runtime, step: LlmStep) -> StepTools:
    specs: list[ToolSpec] = []
    declared: dict[str, dict[str, Any]] = {}
    for entry in step.tools:
        if isinstance(entry, LlmToolDef):
            specs.append(ToolSpec(entry.name, entry.description, dict(entry.parameters)))
            declared[entry.name] = dict(entry.parameters)
            continue
        registered = rt.tools.get(entry.name)
        if registered is None:
            raise StevoraError(
                f"Step '{step.name}' references tool '{entry.name}', which is not registered in this worker "
                f"(load its module with `stevora worker --tools MODULE`)",
                code="TOOL_NOT_REGISTERED",
                retryable=False,
            )
        specs.append(ToolSpec(registered.name, registered.description, dict(registered.parameters)))
    return StepTools(specs, declared)


def render_prompt(step: LlmStep, input: dict[str, Any], state: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    if step.system_prompt:
        messages.append(Message.system(render_template(step.system_prompt, input=input, state=state)))
    for m in step.messages:
        messages.append(Message(role=m.role, content=render_template(m.content, input=input, state=state)))
    return messages


@dataclass(slots=True)
class LoopState:
    transcript: list[Message]
    rounds: list[CommittedRound]
    next_round: int
    tool_rounds: int  # rounds whose tool calls were (or are to be) executed
    feedback_attempts: int = 0
    pending_append: list[Message] = field(default_factory=list)  # stored with the next model call
    cost_usd: float = 0.0
    usage: Usage = field(default_factory=Usage)


def _response_message(response: dict[str, Any]) -> Message:
    calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in response.get("toolCalls") or ())
    return Message(role="assistant", content=response.get("text"), tool_calls=calls)


def rebuild(rounds: list[CommittedRound], prompt: list[Message]) -> LoopState:
    """The conversation so far, from the committed rows (each stored once)."""
    if not rounds:
        return LoopState(transcript=[], rounds=[], next_round=1, tool_rounds=0, pending_append=list(prompt))
    transcript: list[Message] = []
    state = LoopState(transcript=transcript, rounds=rounds, next_round=rounds[-1].round + 1, tool_rounds=0)
    for r in rounds:
        transcript.extend(Message.from_dict(m) for m in r.request.get("messages") or ())
        if r.request.get("feedback"):
            state.feedback_attempts += 1
        msg = _response_message(r.response)
        transcript.append(msg)
        if msg.tool_calls:
            state.tool_rounds += 1
        for index, call in enumerate(msg.tool_calls):
            trace = r.tool_results.get(index)
            if trace is not None:
                transcript.append(
                    Message.tool_result(
                        call.id,
                        checkpoints.replay_result_text(trace),
                        name=call.name,
                        is_error=trace["status"] != "completed",
                    )
                )
        state.cost_usd += r.cost_usd
        state.usage = state.usage + Usage(input_tokens=r.input_tokens, output_tokens=r.output_tokens)
    return state


class LlmStepRun:
    """One execution of an llm step attempt (fresh or resumed)."""

    def __init__(self, rt: Runtime, ex: StepExecution, step: LlmStep) -> None:
        self.rt = rt
        self.ex = ex
        self.step = step
        self.tools = resolve_tools(rt, step)
        self.timeout_s = step.timeout_ms / 1000 if step.timeout_ms else None
        self.log = log.bind(workflow_run_id=ex.run_id, step_name=ex.step_name, attempt=ex.attempt)
        self._model_index = 0  # index into [model, *fallbackModels] of the model that answered last

    async def run(self) -> StepResult:
        prompt = render_prompt(self.step, self.ex.input, self.ex.state)
        rounds = await checkpoints.load_rounds(self.rt.pool, self.ex.run_id, self.ex.step_name, self.ex.visit)
        st = rebuild(rounds, prompt)
        while True:
            last = st.rounds[-1] if st.rounds else None
            if last is not None:
                calls = _response_message(last.response).tool_calls
                if calls and st.tool_rounds > self.step.max_tool_rounds:
                    return await self._max_rounds(st, last)
                if calls:
                    await self._run_missing_tools(st, last, calls)
                else:
                    result = await self._finish(st, last)
                    if result is not None:
                        return result
            round_ = await self._call_model(st)
            st.rounds.append(round_)
            msg = _response_message(round_.response)
            st.transcript.append(msg)
            if msg.tool_calls:
                st.tool_rounds += 1

    # -- model calls ------------------------------------------------------------------------

    async def _call_model(self, st: LoopState) -> CommittedRound:
        appended, st.pending_append = st.pending_append, []
        is_feedback = any(m.role == "user" for m in appended) and bool(st.rounds)
        st.transcript.extend(appended)
        candidates = [self.step.model, *self.step.fallback_models]
        last_error: StevoraError | None = None
        # Stay on the model that answered last: once the primary has failed over, later rounds of
        # this execution do not pay for its failures (and its SDK retries) again.
        for index in range(self._model_index, len(candidates)):
            model = candidates[index]
            provider = self.rt.providers.resolve(model, self.step.provider if index == 0 else None)
            if provider is None:
                self.log.warning("no_provider_for_model", model=model, hint="trying next")
                # A real provider failure (maybe retryable) outranks a missing fallback provider:
                # otherwise an unconfigured fallback would turn a 503 into a permanent failure.
                if not isinstance(last_error, ProviderError):
                    last_error = ProviderNotFound(
                        f"No provider configured for model '{model}'", details={"model": model}
                    )
                continue
            request = LlmRequest(
                model=model,
                messages=prepare_transcript(st.transcript, provider_name=provider.name),
                tools=self.tools.specs,
                temperature=self.step.temperature,
                max_tokens=self.step.max_tokens,
                response_format=self.step.response_format,
                parallel_tool_calls=self.step.parallel_tool_calls,
                timeout_s=self.timeout_s,
                output_schema=self.step.output_schema,
                # The step's toolChoice binds the visit's first call only, so "required" cannot loop.
                tool_choice=tool_choice_of(self.step.tool_choice) if not st.rounds else "auto",
            )
            stored_request = {
                "messages": [m.to_dict() for m in appended],
                "model": model,
                "tools": [t.name for t in self.tools.specs],
                "temperature": self.step.temperature,
                "maxTokens": self.step.max_tokens,
                "responseFormat": self.step.response_format,
                **({"feedback": True} if is_feedback else {}),
            }
            started = time.perf_counter()
            try:
                async with self._limit(provider.name, model):
                    response = await provider.complete(request)
            except ProviderError as exc:
                last_error = exc
                await self._record_failed_call(
                    st, provider, model, stored_request, exc, time.perf_counter() - started
                )
                continue
            self._model_index = index
            return await self._record_call(
                st, provider, model, stored_request, response, time.perf_counter() - started
            )
        assert last_error is not None
        raise last_error

    @contextlib.asynccontextmanager
    async def _limit(self, provider: str, model: str) -> AsyncIterator[None]:
        limits = self.rt.llm_limits
        async with contextlib.AsyncExitStack() as stack:
            for key in (provider, model):
                sem = limits.get(key)
                if sem is not None:
                    await stack.enter_async_context(sem)
            yield

    async def _record_call(
        self,
        st: LoopState,
        provider: Provider,
        model: str,
        stored_request: dict[str, Any],
        response: LlmResponse,
        elapsed_s: float,
    ) -> CommittedRound:
        usage = response.usage
        cost = self.rt.pricing.cost_usd(provider.name, response.model or model, usage)
        calls = [c.to_dict() for c in response.tool_calls]
        rec = LlmCallRecord(
            step_run_id=self.ex.step_run_id,
            step_name=self.ex.step_name,
            round=st.next_round,
            provider=provider.name,
            model=model,
            status="completed",
            request=stored_request,
            response={
                "text": response.text,
                "toolCalls": calls,
                "responseModel": response.model,
                "responseId": response.response_id,
                "priced": cost is not None,
            },
            finish_reason=response.finish_reason,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            cost_usd=cost or 0.0,
            duration_ms=elapsed_s * 1000,
        )
        payload = {
            "llmCallId": rec.id,
            "model": model,
            "provider": provider.name,
            "round": rec.round,
            "inputTokens": usage.input_tokens,
            "outputTokens": usage.output_tokens,
            "costUsd": rec.cost_usd,
            "durationMs": round(rec.duration_ms, 3),
            "toolCalls": [c["name"] for c in calls],
            "finishReason": response.finish_reason,
        }
        await checkpoints.record_llm_call(
            self.rt.pool, self.ex.run_id, self.ex.owner, rec, "LLM_CALL_COMPLETED", payload
        )
        self.rt.faults.reached("llm_call_committed", rec.round)
        st.next_round += 1
        st.cost_usd += rec.cost_usd
        st.usage = st.usage + usage
        return CommittedRound(
            llm_call_id=rec.id,
            step_run_id=rec.step_run_id,
            round=rec.round,
            model=model,
            provider=provider.name,
            request=stored_request,
            response=rec.response or {},
            cost_usd=rec.cost_usd,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            tool_results={},
        )

    async def _record_failed_call(
        self,
        st: LoopState,
        provider: Provider,
        model: str,
        stored_request: dict[str, Any],
        exc: ProviderError,
        elapsed_s: float,
    ) -> None:
        self.log.warning("llm_call_failed", model=model, provider=provider.name, error=exc.message)
        rec = LlmCallRecord(
            step_run_id=self.ex.step_run_id,
            step_name=self.ex.step_name,
            round=st.next_round,
            provider=provider.name,
            model=model,
            status="failed",
            request=stored_request,
            error={**exc.to_dict(), "retryable": exc.retryable},
            duration_ms=elapsed_s * 1000,
        )
        payload = {
            "llmCallId": rec.id,
            "model": model,
            "provider": provider.name,
            "round": rec.round,
            "error": rec.error,
            "durationMs": round(rec.duration_ms, 3),
        }
        await checkpoints.record_llm_call(
            self.rt.pool, self.ex.run_id, self.ex.owner, rec, "LLM_CALL_FAILED", payload
        )

    # -- tool calls -------------------------------------------------------------------------

    async def _run_missing_tools(
        self, st: LoopState, last: CommittedRound, calls: tuple[ToolCall, ...]
    ) -> None:
        missing = [(i, c) for i, c in enumerate(calls) if i not in last.tool_results]
        if not missing:
            return
        if self.step.parallel_tool_calls and len(missing) > 1:
            results = await asyncio.gather(*(self._run_tool(last, i, c) for i, c in missing))
        else:
            results = [await self._run_tool(last, i, c) for i, c in missing]
        # The model sees results in its own call order, whatever order they finished in.
        by_index = dict(zip((i for i, _ in missing), results, strict=True))
        for index, call in enumerate(calls):
            if index in by_index:
                trace = by_index[index]
                last.tool_results[index] = trace
                st.transcript.append(
                    Message.tool_result(
                        call.id, trace["text"], name=call.name, is_error=trace["status"] != "completed"
                    )
                )

    async def _run_tool(self, call_round: CommittedRound, index: int, call: ToolCall) -> dict[str, Any]:
        key = f"{call_round.step_run_id}:{call_round.round}:{index}"
        ctx = ToolContext(
            idempotency_key=key,
            workflow_run_id=self.ex.run_id,
            workspace_id=self.ex.workspace_id,
            step_run_id=self.ex.step_run_id,
            step_name=self.ex.step_name,
            round=call_round.round,
            call_index=index,
            tool_call_id=call.id,
        )
        outcome = await invoke_tool(
            self.rt.tools,
            call.name,
            call.arguments,
            context=ctx,
            declared_schema=self.tools.declared.get(call.name),
            timeout_s=self.step.tool_timeout_ms / 1000,
            max_output_bytes=self.rt.settings.max_tool_output_bytes,
        )
        rec = ToolTraceRecord(
            step_run_id=call_round.step_run_id,
            llm_call_id=call_round.llm_call_id,
            round=call_round.round,
            sequence=index,
            tool_call_id=call.id,
            tool_name=call.name,
            input_json=outcome.input,
            output_json=outcome.output,
            status=outcome.status,
            error=outcome.error,
            error_code=outcome.error_code,
            result_text=None if outcome.ok else outcome.result_text,
            duration_ms=outcome.duration_ms,
            idempotency_key=key,
        )
        payload: dict[str, Any] = {
            "toolTraceId": rec.id,
            "llmCallId": rec.llm_call_id,
            "toolName": call.name,
            "toolCallId": call.id,
            "round": rec.round,
            "sequence": index,
            "durationMs": round(outcome.duration_ms, 3),
        }
        if not outcome.ok:
            payload.update(error=outcome.error, errorCode=outcome.error_code)
        event = "TOOL_CALL_COMPLETED" if outcome.ok else "TOOL_CALL_FAILED"
        self.rt.faults.reached("tool_returned", rec.round, index)
        await checkpoints.record_tool_trace(self.rt.pool, self.ex.run_id, self.ex.owner, rec, event, payload)
        self.rt.faults.reached("tool_committed", rec.round, index)
        return {"status": outcome.status, "text": outcome.result_text}

    # -- endings ----------------------------------------------------------------------------

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
            await store.update_run(
                conn,
                self.ex.run_id,
                expect=["RUNNING"],
                owner=self.ex.owner,
                events=[
                    store.Event(
                        "GUARDRAIL_FAILED",
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
        output: dict[str, Any] = {
            "text": text,
            "model": last.model,
            "provider": last.provider,
            "rounds": len(st.rounds),
            "toolRounds": min(st.tool_rounds, self.step.max_tool_rounds),
            "costUsd": st.cost_usd,
            "usage": {"inputTokens": st.usage.input_tokens, "outputTokens": st.usage.output_tokens},
        }
        if value is not None:
            output["json"] = value
        if stopped_at_limit:
            output["stoppedAtMaxToolRounds"] = True
        if warnings:
            output["guardrailWarnings"] = warnings
        return StepResult(output=output, state_updates={self.step.effective_output_key(): result})


async def execute_llm_step(rt: Runtime, ex: StepExecution, step: LlmStep) -> StepResult:
    try:
        return await LlmStepRun(rt, ex, step).run()
    except LeaseLost:
        raise
    except ProviderError as exc:
        return StepResult(
            status="failed",
            error={**exc.to_dict(), "message": f"All models failed; last error: {exc.message}"},
            retryable=exc.retryable,
        )
