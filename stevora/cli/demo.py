"""`stevora demo`: the example workflows end to end over the HTTP API, with their timelines.

1. `lead-onboarding` (task → wait → condition → task → approval → task): the demo plays the
   reviewer and approves the welcome e-mail through the approvals API.
2. `research-agent` (the reference docs' tool-calling example): an `llm` step with two tools;
   without provider keys the offline scripted provider plays the model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from stevora.cli.output import make_console
from stevora.client import AgentRuntime, WorkflowRun
from stevora.llm.providers import key_variables

# Shipped in the package (a link to the repository's examples/ in a checkout), so a plain
# `pip install` can run the demo from any directory.
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE_TOOLS = "stevora.examples.tools"
console = make_console()

_STYLE = {"COMPLETED": "green", "FAILED": "red", "CANCELLED": "grey50", "WAITING": "yellow"}


def _summary(event_type: str, payload: dict[str, Any]) -> str:
    p = payload
    if event_type in ("STEP_STARTED", "STEP_COMPLETED", "STEP_SKIPPED"):
        extra = (
            f" ({p['durationMs']} ms)"
            if "durationMs" in p
            else (f" [{p['stepType']}]" if "stepType" in p else "")
        )
        return f"{p.get('stepName', '')}{extra}"
    if event_type == "LLM_CALL_COMPLETED":
        tools = ", ".join(p.get("toolCalls") or []) or "final answer"
        return f"round {p['round']} {p['model']}: {p['inputTokens']} in / {p['outputTokens']} out, ${p['costUsd']:.4f} → {tools}"
    if event_type in ("TOOL_CALL_COMPLETED", "TOOL_CALL_FAILED"):
        error = f" {p['error']}" if p.get("error") else ""
        return f"{p['toolName']} (round {p['round']}, {p['durationMs']:.1f} ms){error}"
    if event_type == "WORKFLOW_PAUSED":
        return f"{p.get('reason')} at {p.get('stepName')}"
    if event_type in ("WORKFLOW_RESUMED", "APPROVAL_DECIDED"):
        return ", ".join(
            f"{k}={v}" for k, v in p.items() if k in ("reason", "decision", "decidedBy", "stepName")
        )
    return json.dumps(p)[:100] if p else ""


def print_timeline(client: AgentRuntime, run: WorkflowRun) -> None:
    events = list(client.workflows.iter_events(run.id))
    table = Table(title=f"{run.id} — {run.status}", title_style=_STYLE.get(run.status, ""), expand=False)
    table.add_column("#", justify="right")
    table.add_column("t+ms", justify="right")
    table.add_column("event")
    table.add_column("details", overflow="fold")
    start = events[0].created_at if events else None
    for e in events:
        offset = int((e.created_at - start).total_seconds() * 1000) if (start and e.created_at) else 0
        table.add_row(str(e.sequence), str(offset), e.event_type, _summary(e.event_type, e.payload))
    console.print(table)


def _wait_for_approval(client: AgentRuntime, run_id: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for request in client.approvals.list(pending=True):
            if request.workflow_run_id == run_id:
                return request
        time.sleep(0.2)
    raise TimeoutError(f"run {run_id} never asked for an approval")


def onboarding(client: AgentRuntime) -> WorkflowRun:
    spec = json.loads((EXAMPLES / "lead-onboarding.json").read_text())
    definition = client.definitions.apply(spec)
    run = client.workflows.create(definition.id, {"email": "cto@bigco.example", "companySize": 250})
    console.print(f"[bold]lead-onboarding[/bold]: run {run.id} created ({run.status})")
    request = _wait_for_approval(client, run.id)
    console.print(f"  approval requested for [italic]{request.content_key}[/italic]: {request.content}")
    client.approvals.decide(request.id, "approved", decided_by="demo-reviewer")
    console.print("  approved by demo-reviewer")
    return client.workflows.wait_for_completion(run.id, timeout=60, poll_interval=0.2)


def research_agent(client: AgentRuntime) -> WorkflowRun:
    spec = json.loads((EXAMPLES / "research-agent.json").read_text())
    definition = client.definitions.apply(spec)
    run = client.workflows.create(
        definition.id, {"question": "What is the refund policy for my plan?", "customerId": "cus_42"}
    )
    console.print(f"[bold]research-agent[/bold]: run {run.id} created ({run.status})")
    run = client.workflows.wait_for_completion(run.id, timeout=60, poll_interval=0.2)
    for trace in client.workflows.tool_traces(run.id):
        console.print(
            f"  tool {trace.tool_name}({json.dumps(trace.input_json)}) → {trace.status}: "
            f"{json.dumps(trace.output_json)[:120]}"
        )
    answer = (run.state or {}).get("answer")
    console.print(f"  answer: {str(answer)[:300]}")
    return run


def run_demo(url: str, api_key: str, key_file: Path, *, offline: bool) -> bool:
    if offline:
        keys = " / ".join(key_variables())
        console.print(f"[dim]No {keys}: the offline scripted provider plays the model.[/dim]")
    with AgentRuntime(api_key, base_url=url) as client:
        results = []
        for scenario in (onboarding, research_agent):
            run = scenario(client)
            print_timeline(client, run)
            cost = client.workflows.cost(run.id)
            console.print(
                f"  status [{_STYLE.get(run.status, '')}]{run.status}[/] · "
                f"{cost.total_input_tokens} in / {cost.total_output_tokens} out tokens · ${cost.total_cost_usd:.4f}\n"
            )
            results.append(run.status == "COMPLETED")
    # The demo's server stops when this returns: point at the command that keeps one up, not at
    # this process's (random, about to close) port.
    console.print(
        "The demo's server has stopped. To keep the stack up and browse the runs in the UI, run "
        "[bold]make dev[/bold] (API and UI on http://127.0.0.1:3000, log in with the API key in "
        f"{key_file})."
    )
    return all(results)
