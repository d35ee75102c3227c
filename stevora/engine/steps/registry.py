"""Step types by the `type` name stored on each step run: the engine's half of a step type (its
definition model is in the `StepDefinition` union of stevora/definitions/workflow.py, and
tests/unit/test_architecture.py checks the two name the same types)."""

from __future__ import annotations

from stevora.engine.steps.approval import ApprovalStepType
from stevora.engine.steps.base import StepType
from stevora.engine.steps.condition import ConditionStepType
from stevora.engine.steps.external_event import ExternalEventStepType
from stevora.engine.steps.llm import LlmStepType
from stevora.engine.steps.map import MapStepType
from stevora.engine.steps.task import TaskStepType
from stevora.engine.steps.tool import ToolStepType
from stevora.engine.steps.wait import WaitStepType

REGISTERED: dict[str, StepType] = {
    step_type.name: step_type
    for step_type in (
        TaskStepType(),
        WaitStepType(),
        ConditionStepType(),
        ExternalEventStepType(),
        ApprovalStepType(),
        LlmStepType(),
        ToolStepType(),
        MapStepType(),
    )
}


def step_type(name: str) -> StepType:
    """The step type called `name`; `KeyError` for a name no module registered."""
    return REGISTERED[name]
