"""Pydantic models of workflow definitions: camelCase JSON on the wire, snake_case in Python."""

from stevora.definitions.budget import BUDGET_LIMITS, Budget, BudgetAction
from stevora.definitions.llm_messages import LlmMessage
from stevora.definitions.llm_step import (
    GuardrailCheck,
    GuardrailConfig,
    LlmStep,
    LlmTool,
    LlmToolDef,
    McpToolsDef,
    NamedToolChoice,
    ToolRef,
    WorkflowToolDef,
)
from stevora.definitions.params import ParamsError, parse_default_params
from stevora.definitions.retry import (
    APPROVAL_RETRY_POLICY,
    DEFAULT_RETRY_POLICY,
    CamelModel,
    RetryPolicy,
    compute_next_retry_delay_ms,
)
from stevora.definitions.steps import (
    ApprovalStep,
    ConditionStep,
    ExternalEventStep,
    MapStep,
    StepBase,
    TaskStep,
    ToolStep,
    WaitStep,
)
from stevora.definitions.workflow import (
    STEP_TYPES,
    StepDefinition,
    WorkflowDefinitionSpec,
    parse_definition,
    problems_from_pydantic,
)

__all__ = [
    "APPROVAL_RETRY_POLICY",
    "BUDGET_LIMITS",
    "DEFAULT_RETRY_POLICY",
    "STEP_TYPES",
    "ApprovalStep",
    "Budget",
    "BudgetAction",
    "CamelModel",
    "ConditionStep",
    "ExternalEventStep",
    "GuardrailCheck",
    "GuardrailConfig",
    "LlmMessage",
    "LlmStep",
    "LlmTool",
    "LlmToolDef",
    "MapStep",
    "McpToolsDef",
    "NamedToolChoice",
    "ParamsError",
    "RetryPolicy",
    "StepBase",
    "StepDefinition",
    "TaskStep",
    "ToolRef",
    "ToolStep",
    "WaitStep",
    "WorkflowDefinitionSpec",
    "WorkflowToolDef",
    "compute_next_retry_delay_ms",
    "parse_default_params",
    "parse_definition",
    "problems_from_pydantic",
]
