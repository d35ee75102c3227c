"""Step types by the `type` name stored on each step run."""

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

STEP_TYPES: dict[str, StepType] = {
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
    return STEP_TYPES[name]
