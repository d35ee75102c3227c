"""Stevora: durable workflows with traced, checkpointed LLM tool-calling steps.

The user-facing edge: register task handlers and tools here; run `stevora worker --tools
your.module` so a worker imports the module and these registrations take effect.
"""

from stevora.attachments import File, Image
from stevora.tasks import (
    StepContext,
    StepResult,
    register_task_handler,
    registerTaskHandler,
    task_handler,
)
from stevora.tools import Toolbox, ToolContext, register_tool, register_toolbox, registerTool, tool, toolbox

__version__ = "0.1.0"

__all__ = [
    "File",
    "Image",
    "StepContext",
    "StepResult",
    "ToolContext",
    "Toolbox",
    "__version__",
    "registerTaskHandler",
    "registerTool",
    "register_task_handler",
    "register_tool",
    "register_toolbox",
    "task_handler",
    "tool",
    "toolbox",
]
