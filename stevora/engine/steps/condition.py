"""`condition`: a dot path into run state, coerced with JavaScript `Boolean()` semantics, picks
the step to jump to (`trueStep` / `falseStep`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stevora.definitions import ConditionStep
from stevora.engine.steps.base import StepExecution, StepType
from stevora.tasks import StepResult
from stevora.templating import MISSING, lookup

if TYPE_CHECKING:
    from stevora.runtime import Runtime


def js_truthy(value: Any) -> bool:
    """`Boolean(value)` in JavaScript: `{}` and `[]` are truthy; 0, NaN, "", null, false are not."""
    if value is MISSING or value is None or value is False:
        return False
    if isinstance(value, bool):
        return True
    if isinstance(value, int | float):
        return value != 0 and not (isinstance(value, float) and math.isnan(value))
    if isinstance(value, str):
        return value != ""
    return True  # objects and arrays, empty or not


def evaluate(expression: str, state: Mapping[str, Any]) -> bool:
    """Walk `expression` (`a.b.c`) into state; a missing key at any depth is falsy, never an error."""
    path = expression.strip()
    if path.startswith("state."):
        path = path[len("state.") :]
    return js_truthy(lookup(state, path.split(".")))


class ConditionStepType(StepType):
    name = "condition"

    async def execute(self, rt: Runtime, ex: StepExecution, step: ConditionStep) -> StepResult:
        result = evaluate(step.expression, ex.state)
        target = step.true_step if result else step.false_step
        return StepResult(output={"result": result, "__nextStep": target}, next_step=target)
