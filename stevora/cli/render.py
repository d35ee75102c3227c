"""Rich output for the remote commands: run tables, a run's steps, and lines for events."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from stevora.client import ApprovalRequest, Event, LlmCall, Page, PendingToolCall, ToolTrace, WorkflowRun
from stevora.round_usage import round_usage
from stevora.statuses import AnsweredBy, PauseReason, ResumeReason

STATUS_STYLES = {
    "COMPLETED": "green",
    "FAILED": "red",
    "CANCELLED": "yellow",
    "WAITING": "cyan",
    "PAUSED": "magenta",
    "RUNNING": "blue",
    "PENDING": "dim",
    "SKIPPED": "dim",
}


def status(value: str) -> str:
    style = STATUS_STYLES.get(value, "white")
    return f"[{style}]{escape(value)}[/{style}]"


def duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(int(ms // 1000), 60)
    return f"{minutes}m {seconds:02d}s"


def usd(value: float) -> str:
    return f"${value:.4f}"


def when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def short_json(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def model_ref(model: Any, provider: Any) -> str:
    """`gpt-4o · openai`; an offline scripted answer never reads as a real model call."""
    name = escape(str(model))
    if provider == "scripted" and model != "scripted":
        return f"{name} [yellow]· scripted (offline)[/yellow]"
    return f"{name} [dim]· {escape(str(provider))}[/dim]" if provider else name


def error_text(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    return f"{error.get('code', 'ERROR')}: {error.get('message', '')}"


def runs_table(page: Page[WorkflowRun]) -> Table:
    meta = page.meta
    table = Table(
        title=f"Runs · page {meta.page}/{max(meta.total_pages, 1)} · {meta.total} total", box=box.SIMPLE_HEAD
    )
    table.add_column("ID", no_wrap=True)
    table.add_column("Definition")
    table.add_column("Status", no_wrap=True)
    table.add_column("Step")
    table.add_column("Cost", justify="right", no_wrap=True)
    table.add_column("Created", no_wrap=True)
    for run in page.data:
        created = run.created_at.astimezone().strftime("%m-%d %H:%M:%S") if run.created_at else "-"
        # A queued run (waiting for a concurrency slot) shows its key where a step would be.
        queued = run.queued_at is not None and run.status == "PENDING"
        step = f"queued · {run.concurrency_key}" if queued else (run.current_step_name or "")
        definition = f"{run.definition.name} v{run.definition.version}" if run.definition else ""
        table.add_row(
            run.id, escape(definition), status(run.status), escape(step), usd(run.total_cost_usd), created
        )
    return table


def run_header(run: WorkflowRun) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    definition = f"{run.definition.name} v{run.definition.version}" if run.definition else ""
    grid.add_row("Run", run.id)
    grid.add_row("Definition", f"{escape(definition)} ({run.definition_id})")
    grid.add_row("Status", status(run.status))
    grid.add_row("Created", when(run.created_at))
    if run.started_at:
        grid.add_row("Started", when(run.started_at))
    finished = run.completed_at or run.failed_at or run.cancelled_at
    if finished:
        grid.add_row("Finished", when(finished))
    tokens = run.total_input_tokens + run.total_output_tokens
    grid.add_row("LLM cost", f"{usd(run.total_cost_usd)} ({tokens} tokens)")
    grid.add_row("Input", escape(short_json(run.input)))
    if run.output is not None:
        grid.add_row("Output", escape(short_json(run.output)))
    if run.error:
        grid.add_row("Error", f"[red]{escape(error_text(run.error))}[/red]")
    if run.parent_run_id:
        grid.add_row("Parent", f"{run.parent_run_id} (tool call {escape(run.parent_tool_call_id or '?')})")
    if run.budget:
        grid.add_row("Budget", " · ".join(budget_lines(run)))
    if run.concurrency_key is not None:
        grid.add_row("Concurrency", f"key {escape(run.concurrency_key)} (limit {run.concurrency_limit})")
    if run.queued_at is not None and run.status == "PENDING":
        place = f", position {run.queue_position}" if run.queue_position else ""
        grid.add_row("Queued", f"since {when(run.queued_at)}{place}")
    if run.priority:
        grid.add_row("Priority", str(run.priority))
    return grid


_BUDGET_LINES = (
    ("maxCostCents", "costCents", "cost (cents)"),
    ("maxModelCalls", "modelCalls", "model calls"),
    ("maxToolCalls", "toolCalls", "tool calls"),
)


def budget_lines(run: WorkflowRun) -> list[str]:
    """`tool calls 5 / 5` per limit of the run's budget (used / limit), and what a reached one does."""
    if not run.budget:
        return ["no budget"]
    used = run.budget_used or {}
    lines = []
    for limit, key, label in _BUDGET_LINES:
        if limit in run.budget:
            value = used.get(key)
            shown = f"{value:g}" if isinstance(value, int | float) else "?"
            lines.append(f"{label} {shown} / {run.budget[limit]:g}")
    action = run.budget.get("onBudgetExceeded", "fail")
    lines.append("when reached: " + ("pause for a raise" if action == "pause" else "fail the step"))
    return lines


def pending_tool_calls(run: WorkflowRun) -> Table | None:
    """The client-executed tool calls the run waits for, and the command that answers them."""
    if run.required_action is None or not run.required_action.tool_calls:
        return None
    calls = run.required_action.tool_calls
    table = Table(title="Waiting for tool outputs", box=box.SIMPLE_HEAD, caption=answer_hint(run.id, calls))
    table.add_column("Tool call", no_wrap=True)
    table.add_column("Tool")
    table.add_column("Arguments")
    for call in calls:
        table.add_row(call.id, escape(call.name), escape(short_json(call.arguments)))
    return table


def approval_hint(approval: ApprovalRequest) -> str:
    """The line `runs show` prints for a pending approval: what waits, and the command deciding it."""
    return (
        f"[cyan]⏸[/cyan] {escape(approval.step_name)} waiting for approval — "
        f"[bold]stevora approve {approval.id}[/bold] (or --reject, or --edit CONTENT)"
    )


def answer_hint(run_id: str, calls: list[PendingToolCall]) -> str:
    outputs = " ".join(f"--output {c.id}=JSON" for c in calls)
    return f"answer: [bold]stevora runs tool-outputs {run_id} {escape(outputs)}[/bold]"


def steps_table(run: WorkflowRun) -> Table:
    table = Table(title="Steps", box=box.SIMPLE_HEAD)
    for name, justify in (("#", "right"), ("Step", "left"), ("Type", "left"), ("Status", "left"),
                          ("Attempt", "right"), ("Duration", "right"), ("Error", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for index, step in enumerate(run.step_runs or [], start=1):
        table.add_row(
            str(index),
            escape(step.step_name),
            step.step_type,
            status(step.status) + (f" [dim]{map_progress_text(step.map)}[/dim]" if step.map else ""),
            str(step.attempt),
            duration(step.duration_ms),
            escape(error_text(step.error)),
        )
    return table


def rate_limit_lines(limits: list[dict[str, Any]]) -> list[str]:
    """`stevora rate-limits`: one line per configured provider limit, its use in the window."""

    def use(name: str, pair: dict[str, Any] | None) -> str:
        if pair is None:
            return f"{name} not limited"
        used, limit = pair["used"], pair["limit"]
        mark = "red" if used > limit else "yellow" if used >= 0.9 * limit else "green"
        return f"{name} [{mark}]{used:,.0f}[/{mark}] / {limit:,}"

    lines = []
    for item in limits:
        shrunk = item["inForce"] < 1
        in_force = f"  [red]{item['inForce']:.0%} in force after a provider 429[/red]" if shrunk else ""
        lines.append(
            f"[cyan]{escape(item['key'])}[/cyan]  {use('requests', item['requests'])} · "
            f"{use('tokens', item['tokens'])}  [dim]per {item['windowS']:g} s[/dim]{in_force}"
        )
    return lines or ["[dim]no provider rate limits configured (STEVORA_RATE_LIMITS)[/dim]"]


def llm_call_lines(calls: list[LlmCall]) -> list[str]:
    """`runs llm-calls`: one line per model call (step #round, model · provider, tokens, cost,
    latency and a streamed call's time to first token, the tools it asked for or how it finished),
    readable at any terminal width."""
    lines = []
    for call in calls:
        tools = [str(c.get("name")) for c in (call.response or {}).get("toolCalls") or []]
        if call.status != "completed":
            result = f"[red]{escape(call.status.upper())}[/red] {escape(error_text(call.error))}"
        else:
            result = escape("→ " + ", ".join(tools) if tools else (call.finish_reason or ""))
        ttft = call.time_to_first_token_ms
        first = f" (first token {duration(ttft)})" if ttft is not None else ""
        reasoning = f" ({call.reasoning_tokens} reasoning)" if call.reasoning_tokens else ""
        lines.append(
            f"[cyan]◆[/cyan] {escape(call.step_name)} #{call.round}  {model_ref(call.model, call.provider)}  "
            f"[dim]{call.input_tokens} in / {call.output_tokens} out{reasoning} · {usd(call.cost_usd)} · "
            f"{duration(call.duration_ms)}{first}[/dim]  {result}"
        )
    return lines or ["[dim]no LLM calls[/dim]"]


def round_lines(calls: list[LlmCall]) -> list[str]:
    """`runs show`: per completed model call its input tokens, the cached part and the context it
    leaves (as the run page's waterfall says them); a `compact` summary call is marked."""
    lines = []
    for call in calls:
        if call.status != "completed":
            continue
        usage = round_usage(call.input_tokens, call.cache_read_tokens, call.output_tokens)
        compaction = (call.request or {}).get("compaction")
        if compaction:
            lines.append(
                f"  [magenta]⇤ compaction[/magenta] {escape(call.step_name)} #{call.round}  [dim]{usage}[/dim]  "
                f"summarised {compaction.get('roundsCompacted')} rounds "
                f"({compaction.get('tokensBefore')} → {compaction.get('tokensAfter')} tok)"
            )
        else:
            lines.append(f"  [cyan]◆[/cyan] {escape(call.step_name)} #{call.round}  [dim]{usage}[/dim]")
    return ["[bold]Rounds[/bold]", *lines] if lines else []


def trace_lines(traces: list[ToolTrace]) -> list[str]:
    """`runs traces`: per tool call a head line, then its arguments and its result or error."""
    lines = []
    for trace in traces:
        ok = trace.status == "completed"
        mark = "[green]completed[/green]" if ok else "[red]failed[/red]"
        goto = f" [bold]→ goto {escape(trace.goto_step)}[/bold]" if trace.goto_step else ""
        lines.append(
            f"[magenta]⚙[/magenta] round {trace.round}.{trace.sequence} [bold]{escape(trace.tool_name)}[/bold] "
            f"{mark} [dim]{duration(trace.duration_ms)}[/dim]{goto}"
        )
        lines.append(f"    args    {escape(short_json(trace.input_json, 400))}")
        if ok:
            lines.append(f"    result  {escape(short_json(trace.output_json, 400))}")
        else:
            lines.append(
                f"    error   [red]{escape(trace.error_code or 'ERROR')}[/red]: {escape(trace.error or '')}"
            )
    return lines or ["[dim]no tool calls[/dim]"]


def event_line(event: Event) -> str:
    """`runs events`: sequence, time, type, step and payload of one event."""
    payload = dict(event.payload)
    step = payload.pop("stepName", "")
    stamp = event.created_at.astimezone().strftime("%H:%M:%S.%f")[:-3] if event.created_at else ""
    return (
        f"[dim]{event.sequence:>4}  {stamp}[/dim]  [bold]{event.event_type:<20}[/bold] "
        f"{escape(str(step)):<16} [dim]{escape(short_json(payload))}[/dim]"
    )


RESUME_REASONS = (
    ResumeReason.MANUAL,
    ResumeReason.RETRY,
    ResumeReason.SIGNAL,
    ResumeReason.TOOL_OUTPUTS,
    ResumeReason.CHILD_RUN,
    ResumeReason.TOOL_OUTPUT_TIMEOUT,
    ResumeReason.BUDGET,
    ResumeReason.MAP,
)


def map_progress_text(p: Any) -> str:
    """`3/10 done · 2 running · 1 failed`: a `map` step's progress (its step run's `map`, or a
    MAP_ITEM_* event's payload)."""
    fields: dict[str, Any] = p if isinstance(p, dict) else p.model_dump()
    failed = f" · {fields.get('failed')} failed" if fields.get("failed") else ""
    return f"{fields.get('done')}/{fields.get('total')} done · {fields.get('running')} running{failed}"


def _option(limit: Any) -> str:
    """`maxToolCalls` → `max-tool-calls` (the `runs budget` option that raises it)."""
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in str(limit))


def _answered_by(p: dict[str, Any]) -> str:
    """` · by the client` / ` · by child run wfrun_...` on a tool-call line of an awaited call."""
    if p.get("childRunId"):
        return f" · by child run {escape(str(p['childRunId']))}"
    by = p.get("answeredBy")
    return f" · by the {escape(str(by))}" if by in (AnsweredBy.CLIENT, AnsweredBy.TIMEOUT) else ""


def _awaited_pause(run_id: str, p: dict[str, Any], step: str) -> str:
    """`run --watch` when an llm step hands tool calls to the caller and/or to child runs."""
    lines: list[str] = []
    children = [str(c.get("childRunId")) for c in p.get("childRuns") or [] if isinstance(c, dict)]
    if children:
        lines.append(f"[cyan]⏸[/cyan] {step} waiting for child run(s) {escape(', '.join(children))}")
    calls = [PendingToolCall.model_validate(c) for c in p.get("toolCalls") or []]
    if calls:
        lines.append(f"[cyan]⏸[/cyan] {step} waiting for tool outputs:")
        lines += [f"    {c.id}  {escape(c.name)} {escape(short_json(c.arguments))}" for c in calls]
        lines.append(f"  {answer_hint(run_id, calls)}")
    return "\n".join(lines) or f"[cyan]⏸[/cyan] {step} waiting for tool results"


class Progress:
    """`run --watch`: one readable line per meaningful event, and the run's LLM totals."""

    def __init__(self) -> None:
        self.cost_usd = 0.0
        self.tokens = 0
        self.llm_calls = 0

    def line(self, event: Event) -> str | None:
        p = event.payload
        step = escape(str(p.get("stepName", "")))
        kind = event.event_type
        if kind == "STEP_STARTED":
            retry = f" attempt {p['attempt']}" if p.get("attempt", 1) > 1 else ""
            return f"[blue]▶[/blue] {step} [dim]({p.get('stepType', '')}{retry})[/dim]"
        if kind == "STEP_COMPLETED":
            return f"[green]✓[/green] {step} [dim]{duration(p.get('durationMs'))}[/dim]"
        if kind == "STEP_FAILED":
            return f"[red]✗[/red] {step} failed: {escape(error_text(p.get('error')))}"
        if kind == "STEP_RETRYING":
            attempts = f"attempt {p.get('nextAttempt')}/{p.get('maxAttempts')}"
            return f"[yellow]↻[/yellow] {step} retrying in {duration(p.get('delayMs'))} ({attempts})"
        if kind == "STEP_SKIPPED":
            return f"[dim]- {step} skipped[/dim]"
        if kind == "LLM_CALL_COMPLETED":
            return self._llm_round(p)
        if kind == "LLM_CALL_FAILED":
            model = model_ref(p.get("model"), p.get("provider"))
            return (
                f"  [red]◆ round {p.get('round')} {model} failed[/red]: {escape(error_text(p.get('error')))}"
            )
        if kind in ("TOOL_CALL_COMPLETED", "TOOL_CALL_FAILED"):
            ok = kind == "TOOL_CALL_COMPLETED"
            mark = (
                "[green]completed[/green]" if ok else f"[red]failed[/red] {escape(str(p.get('error', '')))}"
            )
            tool = escape(str(p.get("toolName")))
            goto = f" [bold]→ goto {escape(str(p['gotoStep']))}[/bold]" if p.get("gotoStep") else ""
            return (
                f"    [magenta]⚙[/magenta] {tool} {mark} [dim]{duration(p.get('durationMs'))}"
                f"{_answered_by(p)}[/dim]{goto}"
            )
        if kind == "CONTEXT_COMPACTED":
            return (
                f"  [magenta]⇤ compaction[/magenta] in {step}: {p.get('roundsCompacted')} rounds summarised "
                f"[dim]{p.get('tokensBefore')} → {p.get('tokensAfter')} tok · {usd(float(p.get('costUsd') or 0))}[/dim]"
            )
        if kind == "GUARDRAIL_FAILED":
            return f"  [yellow]⚠ guardrail failed[/yellow] ({escape(str(p.get('action')))}) in {step}"
        if kind in ("MAP_ITEM_COMPLETED", "MAP_ITEM_FAILED"):
            ok = kind == "MAP_ITEM_COMPLETED"
            mark = (
                "[green]completed[/green]"
                if ok
                else f"[red]{escape(str(p.get('status', 'failed')).lower())}[/red]"
            )
            return (
                f"    [magenta]⇶[/magenta] {step}[{p.get('index')}] {mark} "
                f"[dim]child run {escape(str(p.get('childRunId')))} · {map_progress_text(p)}[/dim]"
            )
        return self._run_line(event, step)

    def _llm_round(self, p: dict[str, Any]) -> str:
        cost = float(p.get("costUsd") or 0.0)
        tokens_in, tokens_out = int(p.get("inputTokens") or 0), int(p.get("outputTokens") or 0)
        self.cost_usd += cost
        self.tokens += tokens_in + tokens_out
        self.llm_calls += 1
        tools = p.get("toolCalls") or []
        asks = f" → {escape(', '.join(tools))}" if tools else ""
        return (
            f"  [cyan]◆[/cyan] round {p.get('round')} {model_ref(p.get('model'), p.get('provider'))} "
            f"[dim]{tokens_in} in / {tokens_out} out · {usd(cost)} · "
            f"{duration(p.get('durationMs'))}[/dim]{asks}"
        )

    def _run_line(self, event: Event, step: str) -> str | None:
        kind, p = event.event_type, event.payload
        if kind == "WORKFLOW_PAUSED":
            reason = p.get("reason")
            if reason == PauseReason.WAIT:
                return f"[cyan]⏸[/cyan] {step} waiting until {escape(str(p.get('waitUntil')))}"
            if reason == PauseReason.EXTERNAL_EVENT:
                return f"[cyan]⏸[/cyan] {step} waiting for signal '{escape(str(p.get('signalType')))}'"
            if reason == PauseReason.MANUAL:
                return "[magenta]⏸ paused[/magenta]"
            if reason == PauseReason.MAP:
                fanout = p.get("map") or {}
                return (
                    f"[cyan]⏸[/cyan] {step} mapping {fanout.get('total')} item(s) over "
                    f"'{escape(str(fanout.get('workflow')))}', {fanout.get('concurrency')} at a time"
                )
            if reason in (PauseReason.TOOL_OUTPUTS, PauseReason.CHILD_RUNS):
                return _awaited_pause(event.workflow_run_id, p, step)
            if reason == PauseReason.BUDGET:
                return (
                    f"[yellow]⏸[/yellow] {step} reached its {escape(str(p.get('budgetLimit')))} budget — "
                    f"[bold]stevora runs budget {event.workflow_run_id} --{_option(p.get('budgetLimit'))} N[/bold]"
                )
            return None  # approvals have their own line
        if kind == "APPROVAL_REQUESTED":
            approval = escape(str(p.get("approvalRequestId")))
            return f"[cyan]⏸[/cyan] {step} waiting for approval — [bold]stevora approve {approval}[/bold]"
        if kind == "APPROVAL_DECIDED":
            by = f" by {escape(str(p['decidedBy']))}" if p.get("decidedBy") else ""
            return f"[cyan]☑[/cyan] {step} {escape(str(p.get('decision')))}{by}"
        if kind == "WORKFLOW_RESUMED" and p.get("reason") in RESUME_REASONS:
            return f"[blue]⏵ resumed[/blue] ({escape(str(p.get('reason')))})"
        return None

    def summary(self, run: WorkflowRun) -> str:
        started = run.started_at or run.created_at
        finished = run.completed_at or run.failed_at or run.cancelled_at
        took = duration((finished - started).total_seconds() * 1000) if started and finished else "-"
        line = f"{status(run.status)} in {took} · LLM cost {usd(run.total_cost_usd)}"
        if self.llm_calls:
            line += f" ({self.llm_calls} calls, {self.tokens} tokens)"
        if run.error:
            line += f"\n[red]{escape(error_text(run.error))}[/red]"
        return line
