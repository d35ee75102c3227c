"""The hostile-model suite's counters (one module, so the test and conftest.py share them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class HostileStats:
    runs: int = 0
    turns_generated: int = 0
    calls_generated: int = 0
    model_requests: int = 0  # HTTP requests the fake answered (errors and SDK retries included)
    calls_in_rounds: int = 0  # tool calls in the model answers Stevora committed
    traced: int = 0
    executed: int = 0
    mcp_executed: Counter[str] = field(default_factory=Counter)  # what the MCP server ran, by tool
    refused: Counter[str] = field(default_factory=Counter)  # by error code
    outcomes: Counter[str] = field(default_factory=Counter)  # COMPLETED / FAILED:<code>
    decisions: Counter[str] = field(default_factory=Counter)
    budgeted: int = 0  # runs created with a maxModelCalls / maxToolCalls budget
    api_reads: int = 0
    max_run_s: float = 0.0
    violations: int = 0

    def lines(self) -> list[str]:
        return [
            f"hostile-model runs={self.runs} turns_generated={self.turns_generated} "
            f"model_requests={self.model_requests} calls_generated={self.calls_generated} "
            f"calls_in_committed_rounds={self.calls_in_rounds} traced={self.traced} executed={self.executed} "
            f"violations={self.violations}",
            f"  calls refused by code: {dict(self.refused.most_common())}",
            f"  runs by outcome: {dict(self.outcomes.most_common())}",
            f"  MCP calls the server executed, by tool: {dict(self.mcp_executed.most_common())}",
            f"  runs with a budget: {self.budgeted}; approval decisions: {dict(self.decisions.most_common())}",
            f"  API/UI reads: {self.api_reads}; slowest run: {self.max_run_s:.1f} s",
        ]


STATS = HostileStats()
