"""The `llm` step's model calls: the fallback chain, concurrency caps, and one checkpoint per call
(`llm_calls` row + `LLM_CALL_COMPLETED` / `LLM_CALL_FAILED`, one statement)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog

from stevora.db import checkpoints
from stevora.db.checkpoints import CommittedRound, LlmCallRecord
from stevora.db.database import storable_text
from stevora.definitions import LlmStep
from stevora.engine import provider_limits
from stevora.engine.budget import Meter
from stevora.engine.live_text import LiveText
from stevora.engine.provider_limits import LimitedProvider
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.llm_attachments import ConversationAttachments
from stevora.engine.steps.llm_compact import compact
from stevora.engine.steps.llm_context import compacted, compaction_point, trim_point, trimmed
from stevora.engine.steps.llm_records import completed_call
from stevora.engine.steps.llm_state import LoopState
from stevora.errors import BudgetExceeded, ProviderError, ProviderNotFound, StevoraError
from stevora.events import EventType
from stevora.llm.messages import LlmRequest, LlmResponse, Message, ToolSpec, tool_choice_of
from stevora.llm.provider import Provider
from stevora.llm.transcript import TranscriptRepair
from stevora.observability import hooks as observe

if TYPE_CHECKING:
    from stevora.runtime import Runtime


class ModelCaller:
    """Calls `[model, *fallbackModels]` in order and checkpoints every attempt."""

    def __init__(
        self,
        rt: Runtime,
        ex: StepExecution,
        step: LlmStep,
        tool_specs: list[ToolSpec],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.rt = rt
        self.ex = ex
        self.step = step
        self.tool_specs = tool_specs
        self.log = log
        self.timeout_s = step.timeout_ms / 1000 if step.timeout_ms else None
        self._model_index = 0  # index into [model, *fallbackModels] of the model that answered last
        # The transcript as each provider gets it, kept up to date as the loop appends to it.
        self._repairs: dict[str, TranscriptRepair] = {}
        # Metric labels and children bound once per visit (the label: the price list's name).
        self._observe = observe.ModelCalls(ex.step_run_id, rt.pricing.known_name)
        self._providers: dict[int, Provider | None] = {}  # candidate index -> its provider
        self.meter: Meter | None = None  # the run's budget, when it has one
        self._limited = False  # a candidate waits for its turn under STEVORA_RATE_LIMITS
        self.attachments: ConversationAttachments | None = None  # the bytes of images and files

    async def call(self, st: LoopState) -> CommittedRound:
        faults = self.rt.faults
        if faults.armed:
            faults.reached("llm_call_starting", st.next_round)
        appended, st.pending_append = st.pending_append, []
        own = appended[: len(appended) - st.steered]  # steered messages are not guardrail feedback
        st.steered = 0
        is_feedback = any(m.role == "user" for m in own) and bool(st.rounds)
        st.transcript.extend(appended)
        if self.attachments is not None and appended:  # the prompt's images and files, stored first
            await self.attachments.store(appended)
        stored, history = _without_history(st, appended)
        candidates = [self.step.model, *self.step.fallback_models]
        # The step's `context` strategy, decided once per round from the committed rows.
        trim_through = trim_point(self.step, st, st.transcript)
        point = compaction_point(self.step, st, st.transcript)
        if point is not None:  # `compact`: its own checkpoint, before this round's request
            await compact(self, st, *point)
        compaction = st.compaction
        last_error: StevoraError | None = None
        # Stay on the model that answered last: once the primary has failed over, later rounds of
        # this execution do not pay for its failures (and its SDK retries) again.
        for index in range(self._model_index, len(candidates)):
            if self.meter is not None:
                limit = self.meter.model_call_refused()
                if limit is not None:
                    raise BudgetExceeded(limit)
            model = candidates[index]
            provider = self._provider(index, model)
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
                messages=await self._loaded(
                    st, compacted(trimmed(self._prepared(st, provider.name), trim_through), compaction)
                ),
                tools=self.tool_specs,
                temperature=self.step.temperature,
                max_tokens=self.step.max_tokens,
                response_format=self.step.response_format,
                parallel_tool_calls=self.step.parallel_tool_calls,
                timeout_s=self.timeout_s,
                output_schema=self.step.output_schema,
                structured_output=(self.step.structured_output or "native")
                if self.step.output_schema
                else None,
                # The step's toolChoice binds the visit's first call only, so "required" cannot loop.
                tool_choice=tool_choice_of(self.step.tool_choice) if not st.rounds else "auto",
                # The run's requests share one prompt-cache key: its prefix grows round by round
                # (a thread's turns share the thread's: each turn's prefix is the last one's).
                cache_key=(self.ex.thread_id or self.ex.run_id) if self.step.cache else None,
                api=self.step.api,
                thinking_budget_tokens=self.step.thinking.budget_tokens if self.step.thinking else None,
                reasoning_effort=self.step.reasoning.effort if self.step.reasoning else None,
            )
            stored_request = {
                "messages": [m.to_dict() for m in stored],
                **history,
                "model": model,
                "tools": [t.name for t in self.tool_specs],
                "temperature": self.step.temperature,
                "maxTokens": self.step.max_tokens,
                "responseFormat": self.step.response_format,
                **({"feedback": True} if is_feedback else {}),
                **({"contextTrimmedThrough": trim_through} if trim_through else {}),
                **({"contextCompactedThrough": compaction.through} if compaction else {}),
                **(
                    {"toolChoice": _tool_choice_json(self.step.tool_choice)}
                    if request.tool_choice != "auto"
                    else {}
                ),
            }
            started = time.perf_counter()
            request.sink = live = LiveText(
                self.rt.pool,
                run_id=self.ex.run_id,
                step_run_id=self.ex.step_run_id,
                round_=st.next_round,
                model=model,
                provider=provider.name,
                started=started,
            )
            try:
                with self._observe.call(provider.name, model, st.next_round, request.messages) as obs:
                    live.observation = obs
                    try:
                        limits = self.rt.llm_limits
                        if limits and (provider.name in limits or model in limits):
                            async with self._limit(provider.name, model):
                                response = await provider.complete(request)
                        else:  # no concurrency cap configured: nothing to enter
                            response = await provider.complete(request)
                    finally:
                        await live.aclose()  # its last text deltas go out before its checkpoint
                    obs.answered(response)
            except ProviderError as exc:
                last_error = exc
                await self._record_failed_call(
                    st, provider, model, stored_request, exc, time.perf_counter() - started, live
                )
                continue
            self._model_index = index
            st.trimmed_through = trim_through
            return await self._record_call(
                st, provider, model, stored_request, response, time.perf_counter() - started, live
            )
        assert last_error is not None
        raise last_error

    def _provider(self, index: int, model: str) -> Provider | None:
        """The provider of candidate `index`, resolved once per step visit."""
        if index in self._providers:
            return self._providers[index]
        found = self.rt.providers.resolve(model, self.step.provider if index == 0 else None)
        if found is not None and self.rt.settings.rate_limits:  # STEVORA_RATE_LIMITS: once per visit
            found = provider_limits.of(self.rt).wrap(
                found, model, fallback=index < len(self.step.fallback_models)
            )
            self._limited = True
        self._providers[index] = found
        return found

    async def _loaded(self, st: LoopState, messages: list[Message]) -> list[Message]:
        """The messages with their images' and files' bytes (read once per execution); as they
        are when the conversation has none."""
        attachments = self.attachments
        if attachments is None or not attachments.any_in(st.transcript):
            return messages
        return await attachments.loaded(messages)

    def _prepared(self, st: LoopState, provider_name: str) -> list[Message]:
        repair = self._repairs.get(provider_name)
        if repair is None:
            repair = self._repairs[provider_name] = TranscriptRepair(provider_name)
        return repair.prepare(st.transcript)

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
        live: LiveText,
    ) -> CommittedRound:
        usage = response.usage
        cost = self.rt.pricing.cost_usd(provider.name, response.model or model, usage)
        # What the model wrote, as the row keeps it (NUL, lone surrogates → U+FFFD): the transcript
        # this execution goes on with is the one a resumed execution rebuilds, and the SDK can
        # encode it for the next request.
        text = storable_text(response.text) if response.text is not None else None
        calls = [
            {
                "id": storable_text(c.id),
                "name": storable_text(c.name),
                "arguments": storable_text(c.arguments),
            }
            for c in response.tool_calls
        ]
        self._observe.answered(provider.name, model, usage, cost)
        # How the answer was held to an outputSchema (nothing to say, and no call, without one).
        structured = _NOT_STRUCTURED if response.structured_output is None else _structured(response)
        rec, payload = completed_call(
            self.ex,
            st.next_round,
            provider.name,
            model,
            stored_request,
            response,
            (text, calls),
            cost,
            elapsed_s * 1000,
            live.time_to_first_token_ms,
            response_extra=structured,
        )
        payload["reasoningTokens"] = usage.reasoning_tokens
        payload["timeToFirstTokenMs"] = _ms(rec.time_to_first_token_ms)
        payload["toolCalls"] = [c["name"] for c in calls]
        payload["finishReason"] = response.finish_reason
        payload.update(structured)
        if stored_request.get("contextTrimmedThrough"):  # the step's `context` strategy trimmed
            payload["contextTrimmedThrough"] = stored_request["contextTrimmedThrough"]
        if stored_request.get("contextCompactedThrough"):  # sent with the `compact` summary
            payload["contextCompactedThrough"] = stored_request["contextCompactedThrough"]
        if self._limited and isinstance(provider, LimitedProvider):  # STEVORA_RATE_LIMITS only
            payload["rateLimitWaitMs"] = rec.response["rateLimitWaitMs"] = provider.last_wait_ms  # type: ignore[index]
        committed_at = await checkpoints.record_llm_call(
            self.rt.committer,
            self.ex.run_id,
            self.ex.owner,
            rec,
            EventType.LLM_CALL_COMPLETED,
            payload,
            self.ex.inbox,
        )
        faults = self.rt.faults
        if faults.armed:
            faults.reached("llm_call_committed", rec.round)
        st.next_round += 1
        st.cost_usd += rec.cost_usd
        st.usage = st.usage + usage
        if self.meter is not None:  # as the checkpoint just added to the run's totals
            self.meter.model_calls += 1
            self.meter.cost_cents += rec.cost_usd * 100
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
            committed_at=committed_at,
        )

    async def _record_failed_call(
        self,
        st: LoopState,
        provider: Provider,
        model: str,
        stored_request: dict[str, Any],
        exc: ProviderError,
        elapsed_s: float,
        live: LiveText,
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
            time_to_first_token_ms=live.time_to_first_token_ms,
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
            self.rt.committer,
            self.ex.run_id,
            self.ex.owner,
            rec,
            EventType.LLM_CALL_FAILED,
            payload,
            self.ex.inbox,
        )
        if self.meter is not None:
            self.meter.model_calls += 1


def _without_history(st: LoopState, appended: list[Message]) -> tuple[list[Message], dict[str, Any]]:
    """What the call stores of `appended`: a thread turn's first call stores the history it
    continues as a reference to the earlier turn (`historyFrom`, `historyAt`), not again."""
    ref, st.history_ref = st.history_ref, None
    if ref is None:
        return appended, {}
    run_id, at, count = ref
    return [*appended[:at], *appended[at + count :]], {"historyFrom": run_id, "historyAt": at}


_NOT_STRUCTURED: dict[str, str] = {}


def _structured(response: LlmResponse) -> dict[str, str]:
    """How the answer was held to the step's outputSchema, and why not as asked (docs/providers.md)."""
    out: dict[str, str] = {}
    if response.structured_output is not None:
        out["structuredOutput"] = response.structured_output
    if response.structured_fallback is not None:
        out["structuredOutputFallback"] = response.structured_fallback
    return out


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _tool_choice_json(choice: Any) -> Any:
    """The step's toolChoice as stored with the call: a mode string or `{"name": ...}`."""
    return choice if isinstance(choice, str) else {"name": choice.name}
