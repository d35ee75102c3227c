"""Tools an `llm` step can call: registry, schema-from-type-hints `@tool`, and the invoker.

Handlers are at-least-once and trace records exactly-once: a handler that ran but whose
trace commit did not happen runs again on resume, so side effects should be keyed on
`ToolContext.idempotency_key` (`<stepRunId>:<round>:<callIndex>`).
"""

from stevora.tools.invoke import (
    DeclaredSchemas,
    OutputLimits,
    ToolErrorCode,
    ToolOutcome,
    field_problem,
    invoke_tool,
    schema_problems,
    with_defaults,
)
from stevora.tools.registry import (
    RegisteredTool,
    ToolArgumentError,
    ToolContext,
    ToolRegistry,
    default_registry,
    register_tool,
    registerTool,
    tool,
)
from stevora.tools.schema import schema_from_function
from stevora.tools.toolbox import Toolbox, register_toolbox, toolbox

__all__ = [
    "DeclaredSchemas",
    "OutputLimits",
    "RegisteredTool",
    "ToolArgumentError",
    "ToolContext",
    "ToolErrorCode",
    "ToolOutcome",
    "ToolRegistry",
    "Toolbox",
    "default_registry",
    "field_problem",
    "invoke_tool",
    "registerTool",
    "register_tool",
    "register_toolbox",
    "schema_from_function",
    "schema_problems",
    "tool",
    "toolbox",
    "with_defaults",
]
