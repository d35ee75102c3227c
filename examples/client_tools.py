"""Client-executed tools, end to end with the Python client: this script is the "app" that owns
the tools. It starts a run of `client-tools.json`, and whenever the run waits for tool outputs
(`run.required_action`), runs the tools itself and submits their outputs, until the run ends.

    stevora dev                        # in another terminal (prints an API key)
    STEVORA_API_KEY=stv_... python -m examples.client_tools [--url http://127.0.0.1:3000]

Nothing is held while the run waits: the app could answer seconds or days later, from another
process, and a retried submission of the same outputs is answered 200 without recording twice.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from stevora.client import AgentRuntime, PendingToolCall, ToolOutput, WorkflowRun

HERE = Path(__file__).parent
WEATHER = {"Lisbon": {"tempC": 19, "conditions": "light rain"}, "Oslo": {"tempC": 3, "conditions": "snow"}}


def run_tool(call: PendingToolCall) -> ToolOutput:
    """The app's own tools. A failure is reported as an error result, which the model sees."""
    if call.name == "get_location":
        return ToolOutput(call.id, output={"city": "Lisbon"})
    if call.name == "get_weather":
        city = str(call.arguments.get("city", "")) if isinstance(call.arguments, dict) else ""
        if city not in WEATHER:
            return ToolOutput(
                call.id, output={"city": "Lisbon", **WEATHER["Lisbon"], "note": f"no data for {city!r}"}
            )
        return ToolOutput(call.id, output={"city": city, **WEATHER[city]})
    return ToolOutput(call.id, error=f"This app has no tool called {call.name!r}")


def drive(rt: AgentRuntime, *, timeout_s: float = 120.0, poll_s: float = 0.2) -> WorkflowRun:
    """Apply the definition, start a run, answer its tool calls until it ends; returns the ended run."""
    definition = rt.definitions.apply(json.loads((HERE / "client-tools.json").read_text()))
    run = rt.workflows.create(definition.id)
    print(f"started {run.id}")
    deadline = time.monotonic() + timeout_s
    while not run.is_terminal:
        if run.required_action is not None:
            outputs = [run_tool(call) for call in run.required_action.tool_calls]
            for call, out in zip(run.required_action.tool_calls, outputs, strict=True):
                print(f"  {call.name}({json.dumps(call.arguments)}) -> {json.dumps(out.to_json())}")
            run = rt.workflows.submit_tool_outputs(run.id, outputs)
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run.id} is still {run.status}")
        time.sleep(poll_s)
        run = rt.workflows.get(run.id)
    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Drive the client-tools example with the Python client.")
    parser.add_argument("--url", default=os.environ.get("STEVORA_URL", "http://127.0.0.1:3000"))
    parser.add_argument("--api-key", default=os.environ.get("STEVORA_API_KEY"))
    args = parser.parse_args(argv)
    with AgentRuntime(args.api_key, base_url=args.url) as rt:
        run = drive(rt)
    answer: Any = (run.output or {}).get("advice")
    print(f"{run.status}: {answer}")


if __name__ == "__main__":
    main()
