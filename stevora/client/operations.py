"""Every client operation, written once as a generator of I/O steps (see `protocol.py`).

The docstrings here are the public methods' docstrings: `resources.py` binds these functions to
`AgentRuntime` (run synchronously) and `AsyncAgentRuntime` (awaited).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

from stevora.client.errors import Conflict, NotFound, StevoraConnectionError, WaitTimeout
from stevora.client.models import (
    TERMINAL_EVENTS,
    ApiKey,
    ApprovalRequest,
    CostSummary,
    CreatedApiKey,
    CreatedWebhook,
    Event,
    Health,
    LlmCall,
    Page,
    RunCost,
    ToolTrace,
    Webhook,
    WebhookDelivery,
    WorkflowDefinition,
    WorkflowRun,
    Workspace,
)
from stevora.client.protocol import (
    NEXT_LINE,
    Emit,
    Op,
    OpenStream,
    Request,
    Sleep,
    SSEDecoder,
    StreamOp,
    data_of,
    parse,
    parse_list,
    parse_page,
)
from stevora.client.tool_outputs import ToolOutputItem, tool_outputs_body

Decision = Literal["approved", "rejected", "edited"]
STREAM_RECONNECTS = 5


def _path(*parts: str) -> str:
    """`/v1/...` with each id escaped, so an id can never reach another route."""
    return "/v1/" + "/".join(quote(p, safe="") if i else p for i, p in enumerate(parts))


# -- health, workspaces, API keys -------------------------------------------------------------


def health() -> Op[Health]:
    """The server's health: `status` "ok" or "degraded", and each check's result (no API key needed)."""
    response = yield Request("GET", "/health", authenticated=False, accept=(503,))
    if response.is_success:
        return parse(Health, response)
    details = response.json().get("error", {}).get("details") or {}
    return Health.model_validate({"status": "degraded", **details})


def current_workspace() -> Op[Workspace]:
    """The workspace the API key belongs to."""
    return parse(Workspace, (yield Request("GET", _path("workspaces", "current"))))


def create_workspace(name: str, slug: str, *, admin_token: str | None = None) -> Op[Workspace]:
    """Create a workspace (`admin_token` is required when the server sets ADMIN_TOKEN)."""
    headers = {"x-admin-token": admin_token} if admin_token else None
    body = {"name": name, "slug": slug}
    return parse(Workspace, (yield Request("POST", _path("workspaces"), json=body, headers=headers)))


def create_api_key(
    name: str, *, workspace_id: str | None = None, admin_token: str | None = None
) -> Op[CreatedApiKey]:
    """Create an API key; the raw key is in `.key`, shown this once.

    With the client's API key: a key in its workspace. With `admin_token` and `workspace_id`
    (the client's API key is then not sent): a key in that workspace. With only `workspace_id`
    on a server without ADMIN_TOKEN: the workspace's first key.
    """
    body = {"name": name, "workspaceId": workspace_id} if workspace_id else {"name": name}
    headers = {"x-admin-token": admin_token} if admin_token else None
    request = Request(
        "POST", _path("api-keys"), json=body, headers=headers, authenticated=admin_token is None
    )
    return parse(CreatedApiKey, (yield request))


def list_api_keys() -> Op[list[ApiKey]]:
    """The workspace's API keys (never the raw keys)."""
    return parse_list(ApiKey, (yield Request("GET", _path("api-keys"))))


def revoke_api_key(key_id: str) -> Op[ApiKey]:
    """Revoke a key (idempotent); returns it with `revoked_at` set."""
    return parse(ApiKey, (yield Request("DELETE", _path("api-keys", key_id))))


# -- definitions ---------------------------------------------------------------------------


def create_definition(spec: Mapping[str, Any]) -> Op[WorkflowDefinition]:
    """Create a definition from its JSON form (`name`, `version`, `description`, `steps`).

    Raises `Conflict` when the name and version already exist (definitions are immutable).
    """
    return parse(WorkflowDefinition, (yield Request("POST", _path("workflow-definitions"), json=dict(spec))))


def list_definitions(
    *, name: str | None = None, page: int = 1, page_size: int = 20
) -> Op[Page[WorkflowDefinition]]:
    """Definitions, newest first, optionally only those called `name`."""
    params = {"name": name, "page": page, "pageSize": page_size}
    return parse_page(
        WorkflowDefinition, (yield Request("GET", _path("workflow-definitions"), params=params))
    )


def get_definition(definition_id: str) -> Op[WorkflowDefinition]:
    """One definition by id."""
    return parse(WorkflowDefinition, (yield Request("GET", _path("workflow-definitions", definition_id))))


def find_definition(name: str, version: str | None = None) -> Op[WorkflowDefinition]:
    """The definition called `name` with `version`, or its newest version; `NotFound` if none."""
    page = 1
    while True:
        found = yield from list_definitions(name=name, page=page, page_size=100)
        for definition in found.data:
            if version is None or definition.version == version:
                return definition
        if not found.has_next:
            what = f"'{name}'" + (f" version '{version}'" if version is not None else "")
            raise NotFound(
                f"Workflow definition {what} not found",
                code="NOT_FOUND",
                status_code=404,
                details={"name": name, "version": version},
            )
        page += 1


def apply_definition(spec: Mapping[str, Any]) -> Op[WorkflowDefinition]:
    """Create the definition, or return the stored one with the same name and version.

    Raises `Conflict` if the stored one differs from `spec` in any way, a field removed from the
    file included (a changed workflow needs a new version). Both sides are compared in the form
    the server stores, so fields it fills in with defaults do not count as differences.
    """
    try:
        return (yield from create_definition(spec))
    except Conflict:
        existing = yield from find_definition(str(spec.get("name")), str(spec.get("version")))
    changed = definition_differences(spec, existing)
    if changed:
        raise Conflict(
            f"Definition '{existing.name}' version '{existing.version}' exists with different content "
            f"({', '.join(changed[:5])}); give the changed workflow a new version",
            code="CONFLICT",
            status_code=409,
            details={"definitionId": existing.id, "differences": changed},
        )
    return existing


def definition_differences(spec: Mapping[str, Any], stored: WorkflowDefinition) -> list[str]:
    """Paths where `spec` and the stored definition differ, either way: a value changed, added or
    removed (`systemPrompt` deleted from the file is a difference, not a default)."""
    server_fields = {"id", "workspaceId", "createdAt", "updatedAt"}
    stored_fields = stored.model_dump(by_alias=True, mode="json")
    stored_spec = {k: v for k, v in stored_fields.items() if k not in server_fields and v is not None}
    return _differences(_normalised(spec), _normalised(stored_spec))


def _normalised(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`spec` in the form the server stores (`"search"` → `{"name": "search"}`, defaults filled),
    so applying the same file twice compares equal."""
    from stevora.definitions import parse_definition  # the server's own parser: one normal form

    try:
        parsed = parse_definition(dict(spec))
    except Exception:  # a newer server may accept what this client's parser does not
        return dict(spec)
    normal: dict[str, Any] = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
    return normal


def _differences(wanted: Any, stored: Any, path: str = "") -> list[str]:
    """Paths where `wanted` and `stored` differ (a key missing on either side included)."""
    if isinstance(wanted, dict) and isinstance(stored, dict):
        return [
            d
            for k in [*wanted, *(k for k in stored if k not in wanted)]
            for d in _differences(wanted.get(k), stored.get(k), f"{path}.{k}" if path else k)
        ]
    if isinstance(wanted, list) and isinstance(stored, list) and len(wanted) == len(stored):
        return [
            d
            for i, (w, s) in enumerate(zip(wanted, stored, strict=True))
            for d in _differences(w, s, f"{path}[{i}]")
        ]
    return [] if wanted == stored else [path or "<root>"]


# -- runs ----------------------------------------------------------------------------------


def create_run(
    definition_id: str | Mapping[str, Any],
    input: Mapping[str, Any] | None = None,
    *,
    idempotency_key: str | None = None,
    budget: Mapping[str, Any] | None = None,
    wait: float | None = None,
) -> Op[WorkflowRun]:
    """Start a run of a definition: its id, or an ad-hoc definition as a dict (the body of
    `definitions.create`, `name` and `version` optional; stored on first use). With
    `idempotency_key`, a run already created with that key is returned instead (`run.created`
    tells which). `budget` (`{"maxToolCalls": 20, ...}`) overrides the definition's, field by
    field. With `wait` (seconds, capped by the server) the answer comes once the run has
    completed, failed, or requires action (`run.required_action`), else at the bound."""
    body: dict[str, Any] = {"input": dict(input or {})}
    if isinstance(definition_id, str):
        body["definitionId"] = definition_id
    else:
        body["definition"] = dict(definition_id)
    if idempotency_key is not None:
        body["idempotencyKey"] = idempotency_key
    if budget is not None:
        body["budget"] = dict(budget)
    response = yield Request(
        "POST", _path("workflow-runs"), params=_wait(wait), json=body, held_s=wait or 0.0
    )
    run = parse(WorkflowRun, response)
    run.created = response.status_code == 201
    return run


def get_run(run_id: str, *, wait: float | None = None) -> Op[WorkflowRun]:
    """A run with its `step_runs` and its `definition` (name, version). With `wait` (seconds), a
    long poll: the answer comes once the run is settled (ended, paused, or `required_action`)."""
    request = Request("GET", _path("workflow-runs", run_id), params=_wait(wait), held_s=wait or 0.0)
    return parse(WorkflowRun, (yield request))


def _wait(wait: float | None) -> dict[str, Any] | None:
    return {"wait": wait} if wait else None


def run_until_action(run_id: str, *, timeout: float = 300.0, wait: float = 30.0) -> Op[WorkflowRun]:
    """Long-poll the run until it has ended (COMPLETED, FAILED, CANCELLED), is PAUSED, or requires
    action (`run.required_action`: client tool calls to answer), and return it.

    The client-tool loop without SSE or webhooks::

        run = rt.workflows.run_until_action(rt.workflows.create(definition, input).id)
        while run.required_action:
            outputs = [ToolOutput(c.id, output=TOOLS[c.name](**c.arguments))
                       for c in run.required_action.tool_calls]
            rt.workflows.submit_tool_outputs(run.id, outputs)
            run = rt.workflows.run_until_action(run.id)

    Raises `WaitTimeout` (with the last seen run in `.run`) after `timeout` s.
    """
    deadline = time.monotonic() + timeout
    while True:
        asked = max(0.0, min(wait, deadline - time.monotonic()))
        started = time.monotonic()
        run = yield from get_run(run_id, wait=asked)
        if run.is_terminal or run.required_action is not None or run.status == "PAUSED":
            return run
        if deadline - time.monotonic() <= 0:
            raise WaitTimeout(run, timeout)
        if time.monotonic() - started < asked / 2:  # the server waits less (its cap): poll gently
            yield Sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def list_runs(
    *,
    page: int = 1,
    page_size: int = 20,
    status: str | None = None,
    definition_id: str | None = None,
    parent_run_id: str | None = None,
    definition_name: str | None = None,
) -> Op[Page[WorkflowRun]]:
    """Runs, newest first, optionally filtered by status, definition (an id, or a name: every
    version) and parent run (the child runs a run started by calling workflows as tools)."""
    params = {
        "page": page,
        "pageSize": page_size,
        "status": status,
        "definitionId": definition_id,
        "parentRunId": parent_run_id,
        "definitionName": definition_name,
    }
    return parse_page(WorkflowRun, (yield Request("GET", _path("workflow-runs"), params=params)))


def _command(run_id: str, action: str, body: dict[str, Any] | None = None) -> Op[WorkflowRun]:
    return parse(
        WorkflowRun, (yield Request("POST", _path("workflow-runs", run_id, action), json=body or {}))
    )


def cancel_run(run_id: str) -> Op[WorkflowRun]:
    """Cancel a run that has not finished (`InvalidStateTransition` otherwise)."""
    return (yield from _command(run_id, "cancel"))


def retry_run(run_id: str) -> Op[WorkflowRun]:
    """Run a FAILED run again from its failed step."""
    return (yield from _command(run_id, "retry"))


def pause_run(run_id: str) -> Op[WorkflowRun]:
    """Pause a RUNNING run after its current step; `resume` continues it."""
    return (yield from _command(run_id, "pause"))


def set_run_budget(
    run_id: str,
    *,
    max_cost_cents: float | None = None,
    max_model_calls: int | None = None,
    max_tool_calls: int | None = None,
    on_budget_exceeded: str | None = None,
) -> Op[WorkflowRun]:
    """Change a run's budget: the limits given replace the run's (the others stay). A run waiting
    for its budget (`onBudgetExceeded: "pause"`) resumes. The answer is the run as `get` gives it."""
    given = {
        "maxCostCents": max_cost_cents,
        "maxModelCalls": max_model_calls,
        "maxToolCalls": max_tool_calls,
        "onBudgetExceeded": on_budget_exceeded,
    }
    body = {key: value for key, value in given.items() if value is not None}
    return parse(WorkflowRun, (yield Request("POST", _path("workflow-runs", run_id, "budget"), json=body)))


def resume_run(
    run_id: str, signal_type: str | None = None, payload: Mapping[str, Any] | None = None
) -> Op[WorkflowRun]:
    """Deliver a signal to a run waiting in an `external_event` step (`payload` is merged into its
    state), or un-pause a PAUSED run (no `signal_type`)."""
    body: dict[str, Any] = {}
    if signal_type is not None:
        body["signalType"] = signal_type
    if payload is not None:
        body["payload"] = dict(payload)
    return (yield from _command(run_id, "resume", body))


def submit_tool_outputs(
    run_id: str, outputs: Iterable[ToolOutputItem], *, wait: float | None = None
) -> Op[WorkflowRun]:
    """Answer some or all of the run's pending client-executed tool calls (`run.required_action`).

    Items are `ToolOutput(call_id, output=...)` / `ToolOutput(call_id, error="...")` or the API's
    dicts. Returns the run as `get` does: still WAITING with the remaining calls, or resumed once
    the last one is answered. Resending exactly what was recorded is safe (a retry after a lost
    answer). Raises `InvalidToolOutputs` (unknown call, or answered differently; nothing of the
    request is recorded), `ToolOutputTooLarge`, or `InvalidStateTransition` when nothing is pending.
    With `wait` (seconds) the answer comes once the run is settled again (its next
    `required_action`, or its end), else at the bound.
    """
    body = tool_outputs_body(outputs)
    path = _path("workflow-runs", run_id, "tool-outputs")
    request = Request("POST", path, params=_wait(wait), json=body, held_s=wait or 0.0)
    return parse(WorkflowRun, (yield request))


def list_events(run_id: str, *, page: int = 1, page_size: int = 20) -> Op[Page[Event]]:
    """One page of a run's events, oldest first."""
    params = {"page": page, "pageSize": page_size}
    return parse_page(Event, (yield Request("GET", _path("workflow-runs", run_id, "events"), params=params)))


# SSE messages of the run stream that are not stored events (docs/api/workflow-runs.md, "Live text").
EPHEMERAL_EVENTS = frozenset({"llm.text.delta"})


def iter_events(run_id: str, *, page_size: int = 100) -> StreamOp[Event]:
    """Every event of a run so far, oldest first (fetched page by page)."""
    page = 1
    while True:
        found = yield from list_events(run_id, page=page, page_size=page_size)
        for event in found.data:
            yield Emit(event)
        if not found.has_next:
            return
        page += 1


def stream_events(run_id: str, last_event_id: int | str | None = None) -> StreamOp[Event]:
    """Follow a run's events live (Server-Sent Events) until the run finishes.

    Starts after `last_event_id` (an event `sequence`), else from the first event. A dropped
    connection is resumed where it broke, without gaps or repeats. Only stored events are
    yielded; the stream's ephemeral `llm.text.delta` messages are skipped.
    """
    path = _path("workflow-runs", run_id, "events", "stream")
    last = str(last_event_id) if last_event_id is not None else None
    failures = 0
    while True:
        headers = (
            {"Last-Event-ID": last, "accept": "text/event-stream"}
            if last
            else {"accept": "text/event-stream"}
        )
        finished = False
        try:
            yield OpenStream(Request("GET", path, headers=headers))
            decoder = SSEDecoder()
            while (line := (yield NEXT_LINE)) is not None:
                message = decoder.feed(line)
                if message is None or not message.data or message.event in EPHEMERAL_EVENTS:
                    continue  # live text deltas: not stored events, no sequence to resume from
                event = Event.model_validate_json(message.data)
                last, failures = str(event.sequence), 0
                finished = event.event_type in TERMINAL_EVENTS
                yield Emit(event)
        except StevoraConnectionError:
            failures += 1
            if failures > STREAM_RECONNECTS:
                raise
            yield Sleep(min(0.25 * 2**failures, 5.0))
            continue
        if finished or (yield from get_run(run_id)).is_terminal:
            return  # the server ends the stream at the end of a run; anything else was a hiccup


def llm_calls(run_id: str, *, step_name: str | None = None) -> Op[list[LlmCall]]:
    """The run's LLM calls (completed and failed), oldest first, optionally of one step."""
    params = {"stepName": step_name}
    return parse_list(
        LlmCall, (yield Request("GET", _path("workflow-runs", run_id, "llm-calls"), params=params))
    )


def tool_traces(run_id: str, *, step_name: str | None = None) -> Op[list[ToolTrace]]:
    """The run's tool calls in execution order, optionally of one step."""
    params = {"stepName": step_name}
    return parse_list(
        ToolTrace, (yield Request("GET", _path("workflow-runs", run_id, "tool-traces"), params=params))
    )


def run_cost(run_id: str) -> Op[RunCost]:
    """The run's LLM cost: totals in USD and tokens, and each call."""
    return parse(RunCost, (yield Request("GET", _path("workflow-runs", run_id, "cost"))))


def checkpoints(run_id: str) -> Op[list[dict[str, Any]]]:
    """Every point the run can be forked at, in order (before each step; inside an llm step before
    each round's model call), each with `state` as it was there and `next` (what happened next)."""
    result: list[dict[str, Any]] = data_of(
        (yield Request("GET", _path("workflow-runs", run_id, "checkpoints")))
    )
    return result


def fork(
    run_id: str,
    at: str | Mapping[str, Any],
    *,
    state: Mapping[str, Any] | None = None,
    tool_results: Mapping[str, Any] | None = None,
    model: str | None = None,
    system_prompt: str | None = None,
    definition_version: str | None = None,
    idempotency_key: str | None = None,
) -> Op[dict[str, Any]]:
    """Fork the run at `at` (`"agent"`, `"agent:3"` or `{"step": ..., "round": ...}`): a new run
    that inherits everything before it and goes on with the edits applied (docs/time-travel.md).
    Returns the new run (`id`, `forkedFrom`, `edits`, `state`)."""
    edits: dict[str, Any] = {}
    if state:
        edits["state"] = dict(state)
    if tool_results:
        edits["toolResults"] = dict(tool_results)
    if model is not None:
        edits["model"] = model
    if system_prompt is not None:
        edits["systemPrompt"] = system_prompt
    if definition_version is not None:
        edits["definitionVersion"] = definition_version
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    body = {"at": at if isinstance(at, str) else dict(at), "edits": edits}
    request = Request("POST", _path("workflow-runs", run_id, "fork"), json=body, headers=headers)
    result: dict[str, Any] = data_of((yield request))
    return result


def _replay_options(
    model: str | None,
    system_prompt: str | None,
    step: str | None,
    definition_version: str | None,
    unmatched: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"tools": "recorded"}
    options = (
        ("model", model),
        ("systemPrompt", system_prompt),
        ("step", step),
        ("definitionVersion", definition_version),
        ("unmatched", unmatched),
    )
    body.update((key, value) for key, value in options if value is not None)
    return body


def replay(
    run_id: str,
    *,
    model: str | None = None,
    system_prompt: str | None = None,
    step: str | None = None,
    definition_version: str | None = None,
    unmatched: str | None = None,
    idempotency_key: str | None = None,
) -> Op[dict[str, Any]]:
    """Drive the run again from its first step (with another `model` / `system_prompt` for `step`,
    default its first llm step; under another `definition_version` of its definition), each tool
    call answered from the run's recorded results: no handler, client tool or child run is
    started. An unmatched call fails (`unmatched="error"`, the default) or runs live
    (`unmatched="live"`). Returns the new run (`id`, `replayOf`)."""
    body = _replay_options(model, system_prompt, step, definition_version, unmatched)
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    request = Request("POST", _path("workflow-runs", run_id, "replay"), json=body, headers=headers)
    result: dict[str, Any] = data_of((yield request))
    return result


def bulk_replay(
    *,
    definition: str | None = None,
    last: int | None = None,
    run_ids: Sequence[str] | None = None,
    model: str | None = None,
    system_prompt: str | None = None,
    step: str | None = None,
    definition_version: str | None = None,
    unmatched: str | None = None,
    idempotency_key: str | None = None,
) -> Op[dict[str, Any]]:
    """Replay the last `last` ended runs of `definition` (or each of `run_ids`) with recorded tools:
    `{count, replays: [{runId, replayId, error}]}`. `compare_replays` puts them beside their origins."""
    body = _replay_options(model, system_prompt, step, definition_version, unmatched)
    if definition is not None:
        body["definition"] = definition
    if last is not None:
        body["last"] = last
    if run_ids is not None:
        body["runIds"] = list(run_ids)
    if idempotency_key is not None:
        body["idempotencyKey"] = idempotency_key
    result: dict[str, Any] = data_of((yield Request("POST", _path("replays"), json=body)))
    return result


def compare_replays(replay_ids: Sequence[str]) -> Op[dict[str, Any]]:
    """Each replay beside its origin: status, output, rounds, tool calls (matched / unmatched /
    live), tokens, cost, latency; `done` once every replay has ended."""
    params = {"runs": ",".join(replay_ids)}
    result: dict[str, Any] = data_of((yield Request("GET", _path("replays", "compare"), params=params)))
    return result


def retry_failed(
    *,
    definition: str | None = None,
    run_ids: Sequence[str] | None = None,
    since: str | None = None,
    until: str | None = None,
    dry_run: bool = False,
) -> Op[dict[str, Any]]:
    """Retry every FAILED run of `definition` that failed in [since, until) (ISO 8601), or of
    `run_ids`; with `dry_run` only `{count, runIds}`. Otherwise `{count, retried, results: [{runId,
    outcome: "RETRIED" | "ERROR", error}]}`: one run's failure does not stop the others."""
    body: dict[str, Any] = {"dryRun": dry_run}
    for key, value in (("definition", definition), ("since", since), ("until", until)):
        if value is not None:
            body[key] = value
    if run_ids is not None:
        body["runIds"] = list(run_ids)
    request = Request("POST", _path("retries"), json=body)
    result: dict[str, Any] = data_of((yield request))
    return result


def rate_limits() -> Op[list[dict[str, Any]]]:
    """The deployment's provider rate limits (`STEVORA_RATE_LIMITS`) and their current use: per
    key, `requests` / `tokens` as `{used, limit}` (null when not limited), `windowS`, `inForce`."""
    result: list[dict[str, Any]] = data_of((yield Request("GET", _path("rate-limits"))))
    return result


def lineage(run_id: str) -> Op[dict[str, Any]]:
    """The run's origin (`forkedFrom`, `replayOf`), its forks, and for a replay its matched /
    unmatched tool calls."""
    result: dict[str, Any] = data_of((yield Request("GET", _path("workflow-runs", run_id, "lineage"))))
    return result


def wait_for_completion(
    run_id: str, *, timeout: float = 300.0, poll_interval: float = 1.0
) -> Op[WorkflowRun]:
    """Poll until the run is COMPLETED, FAILED or CANCELLED and return it (with its step runs).

    Raises `WaitTimeout` (a `TimeoutError`, with the last seen run in `.run`) after `timeout` s.
    """
    deadline = time.monotonic() + timeout
    while True:
        run = yield from get_run(run_id)
        remaining = deadline - time.monotonic()
        if run.is_terminal:
            return run
        if remaining <= 0:
            raise WaitTimeout(run, timeout)
        yield Sleep(min(poll_interval, remaining))


# -- approvals, webhooks, cost ---------------------------------------------------------------


def list_approvals(*, pending: bool | None = None, limit: int | None = None) -> Op[list[ApprovalRequest]]:
    """Approval requests, newest first: `pending=True` undecided, `False` decided, `None` all."""
    params = {"pending": pending, "limit": limit}
    return parse_list(ApprovalRequest, (yield Request("GET", _path("approval-requests"), params=params)))


def get_approval(approval_id: str) -> Op[ApprovalRequest]:
    """One approval request."""
    return parse(ApprovalRequest, (yield Request("GET", _path("approval-requests", approval_id))))


def decide_approval(
    approval_id: str, decision: Decision, *, edited_content: Any = None, decided_by: str | None = None
) -> Op[ApprovalRequest]:
    """Approve, reject or edit (`edited_content` replaces the reviewed state value); the run resumes."""
    body: dict[str, Any] = {"decision": decision}
    if edited_content is not None:
        body["editedContent"] = edited_content
    if decided_by is not None:
        body["decidedBy"] = decided_by
    response = yield Request("POST", _path("approval-requests", approval_id, "decide"), json=body)
    return parse(ApprovalRequest, response)


def create_webhook(url: str, events: list[str]) -> Op[CreatedWebhook]:
    """Subscribe `url` to webhook events; the signing secret is in `.secret`, shown this once."""
    body = {"url": url, "events": list(events)}
    return parse(CreatedWebhook, (yield Request("POST", _path("webhooks"), json=body)))


def list_webhooks() -> Op[list[Webhook]]:
    """The workspace's webhooks (without secrets)."""
    return parse_list(Webhook, (yield Request("GET", _path("webhooks"))))


def delete_webhook(webhook_id: str) -> Op[Webhook]:
    """Delete a webhook; returns what was deleted."""
    return parse(Webhook, (yield Request("DELETE", _path("webhooks", webhook_id))))


def webhook_deliveries(
    webhook_id: str, *, page: int = 1, page_size: int = 20, status: str | None = None
) -> Op[Page[WebhookDelivery]]:
    """A webhook's deliveries, newest first, each with its attempt log."""
    params = {"page": page, "pageSize": page_size, "status": status}
    return parse_page(
        WebhookDelivery, (yield Request("GET", _path("webhooks", webhook_id, "deliveries"), params=params))
    )


def cost_summary(*, from_: datetime | str | None = None, to: datetime | str | None = None) -> Op[CostSummary]:
    """The workspace's LLM cost over [from_, to) (either may be omitted), with a per-model breakdown."""
    params = {"from": _instant(from_), "to": _instant(to)}
    return parse(CostSummary, (yield Request("GET", _path("cost", "summary"), params=params)))


def _instant(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value
