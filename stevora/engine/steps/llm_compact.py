"""The `compact` context strategy's model call: its own checkpoint.

Before a round whose input would exceed `context.maxInputTokens` (`llm_context.compaction_point`),
one model call — `context.model` or the step's model, no tools offered — summarises the rounds
before the last `keepLastRounds`. It is committed like a round: an `llm_calls` row numbered as the
next round (its request marked `compaction`, its response the summary) and a `CONTEXT_COMPACTED`
event (`tokensBefore`, `tokensAfter`, `roundsCompacted`), in one statement. Every later request of
the step sends the summary in place of those rounds (`llm_context.compacted`); a rebuilt step reads
the summary from the row and never asks for it again, so it sends the bytes the lost one sent. A
fork at the compaction's round starts before it (and compacts again); at the next one, after it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from stevora.db import checkpoints
from stevora.db.checkpoints import LlmCallRecord
from stevora.db.database import storable_text
from stevora.engine.steps.llm_context import compacted, compaction_prompt, estimate
from stevora.engine.steps.llm_records import completed_call
from stevora.engine.steps.llm_state import Compaction, LoopState
from stevora.errors import BudgetExceeded, ProviderError, ProviderNotFound
from stevora.events import EventType
from stevora.llm.messages import LlmRequest

if TYPE_CHECKING:
    from stevora.definitions import LlmStep
    from stevora.engine.budget import Meter
    from stevora.engine.steps.base import StepExecution
    from stevora.llm.messages import Message
    from stevora.llm.provider import Provider
    from stevora.observability.hooks import ModelCalls
    from stevora.runtime import Runtime


class Caller(Protocol):
    """What the compaction uses of the step's model caller (`llm_model.ModelCaller`)."""

    rt: Runtime
    ex: StepExecution
    step: LlmStep
    meter: Meter | None
    timeout_s: float | None
    _observe: ModelCalls
    _model_index: int

    def _provider(self, index: int, model: str) -> Provider | None: ...

    def _prepared(self, st: LoopState, provider_name: str) -> list[Message]: ...


async def compact(caller: Caller, st: LoopState, through: int, tokens_before: int) -> None:
    """Summarise the rounds through `through`, commit the checkpoint, and make it the state's
    compaction. A failed call is recorded (`LLM_CALL_FAILED`) and fails the step as any model
    call's error does; nothing of it is used."""
    step, ex, rt = caller.step, caller.ex, caller.rt
    assert step.context is not None
    if caller.meter is not None:
        limit = caller.meter.model_call_refused()
        if limit is not None:
            raise BudgetExceeded(limit)
    if step.context.model is not None:  # routed by its name
        model = step.context.model
        provider = rt.providers.resolve(model, None)
    else:  # the step's model that answers now (after a failover, the fallback that answered)
        index = caller._model_index
        model = [step.model, *step.fallback_models][index]
        provider = caller._provider(index, model)
    if provider is None:
        raise ProviderNotFound(
            f"No provider configured for model '{model}' (context.model)", details={"model": model}
        )
    previous = st.compaction
    prepared = caller._prepared(st, provider.name)
    prompt = compaction_prompt(prepared, previous, through)
    # The step's API (a Responses-API step summarises through the Responses API too) and
    # reasoning effort; no thinking: a tool-less summary needs no thinking blocks, and its
    # `max_tokens` then needs no room for a thinking budget. No reasoning items either: the
    # rounds go in as text, one user turn (`compaction_prompt`).
    request = LlmRequest(
        model=model,
        messages=[prompt],
        max_tokens=step.max_tokens,
        timeout_s=caller.timeout_s,
        cache_key=ex.run_id if step.cache else None,
        api=step.api,
        reasoning_effort=step.reasoning.effort if step.reasoning else None,
    )
    rounds_compacted = through - (previous.through if previous is not None else 0)
    marker = {"through": through, "roundsCompacted": rounds_compacted, "tokensBefore": tokens_before}
    stored_request = {"compaction": marker, "messages": [prompt.to_dict()], "model": model, "tools": []}
    round_ = st.next_round
    started = time.perf_counter()
    try:
        # A `chat` span and the model-call metrics, as for a round of the loop.
        with caller._observe.call(provider.name, model, round_, request.messages) as obs:
            response = await provider.complete(request)
            obs.answered(response)
    except ProviderError as exc:
        rec = LlmCallRecord(
            step_run_id=ex.step_run_id,
            step_name=ex.step_name,
            round=round_,
            provider=provider.name,
            model=model,
            status="failed",
            request=stored_request,
            error={**exc.to_dict(), "retryable": exc.retryable},
            duration_ms=(time.perf_counter() - started) * 1000,
        )
        payload = {"llmCallId": rec.id, "model": model, "provider": provider.name, "round": round_}
        payload |= {"kind": "compaction", "error": rec.error, "durationMs": round(rec.duration_ms, 3)}
        await checkpoints.record_llm_call(
            rt.committer, ex.run_id, ex.owner, rec, EventType.LLM_CALL_FAILED, payload
        )
        if caller.meter is not None:
            caller.meter.model_calls += 1
        raise
    elapsed_ms = (time.perf_counter() - started) * 1000
    summary = storable_text(response.text or "")
    after = Compaction(round_, through, summary, 0)
    marker["tokensAfter"] = tokens_after = estimate(compacted(prepared, after))
    usage = response.usage
    cost = rt.pricing.cost_usd(provider.name, response.model or model, usage)
    caller._observe.answered(provider.name, model, usage, cost)
    rec, payload = completed_call(
        ex, round_, provider.name, model, stored_request, response, (summary, []), cost, elapsed_ms
    )
    payload |= {
        "stepName": ex.step_name,
        "tokensBefore": tokens_before,
        "tokensAfter": tokens_after,
        "roundsCompacted": rounds_compacted,
        "compactedThrough": through,
    }
    await checkpoints.record_llm_call(
        rt.committer, ex.run_id, ex.owner, rec, EventType.CONTEXT_COMPACTED, payload
    )
    faults = rt.faults
    if faults.armed:
        faults.reached("context_compacted", round_)
    st.compaction = Compaction(round_, through, summary, tokens_after)
    st.next_round += 1
    st.cost_usd += rec.cost_usd
    st.usage = st.usage + usage
    if caller.meter is not None:
        caller.meter.model_calls += 1
        caller.meter.cost_cents += rec.cost_usd * 100
