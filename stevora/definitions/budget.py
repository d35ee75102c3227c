"""A run's budget: how much a run may spend and how many model and tool calls it may make.

    {"budget": {"maxCostCents": 200, "maxModelCalls": 40, "maxToolCalls": 100, "onBudgetExceeded": "pause"}}

A definition's `budget` is the default of its runs; a run's create request may override any field
(within the server's ceiling, `STEVORA_MAX_RUN_*`). What counts and when it is checked:
docs/definitions.md#budgets.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stevora.definitions.retry import CamelModel

# Far beyond any real run, small enough to be exact in a float and in JSON everywhere.
MAX_BUDGET_COUNT = 1_000_000_000
MAX_BUDGET_CENTS = 1_000_000_000.0

BudgetAction = Literal["fail", "pause"]
# The limits by their wire names, in the order they are reported.
BUDGET_LIMITS: tuple[str, ...] = ("maxCostCents", "maxModelCalls", "maxToolCalls")


class Budget(CamelModel):
    """Limits of one run; a field left out is no limit (unless the server sets a ceiling)."""

    # strict: `false` or `"5"` is a 400, not a limit of 0 or 5 (a bool is an int to lax pydantic).
    max_cost_cents: float | None = Field(
        default=None, ge=0, le=MAX_BUDGET_CENTS, allow_inf_nan=False, strict=True
    )
    """The run's model spend, in US cents (`totalCostCents`): checked before each model call."""
    max_model_calls: int | None = Field(default=None, ge=0, le=MAX_BUDGET_COUNT, strict=True)
    """Model calls the run may make (failed ones included), across all its steps and attempts."""
    max_tool_calls: int | None = Field(default=None, ge=0, le=MAX_BUDGET_COUNT, strict=True)
    """Tool calls the run may make, except calls of tools a step does not offer (TOOL_NOT_OFFERED)."""
    on_budget_exceeded: BudgetAction = "fail"
    """`fail`: the step fails with BUDGET_EXCEEDED (not retried). `pause`: the run waits for a person
    to raise the budget (`POST /v1/workflow-runs/{id}/budget`), then goes on."""
