"""The Python client of the Stevora HTTP API.

```python
from stevora.client import AgentRuntime

with AgentRuntime("stv_...", base_url="http://localhost:3000") as rt:
    definition = rt.definitions.apply({"name": "hello", "version": "1", "steps": [...]})
    run = rt.workflows.create(definition.id, {"name": "Ada"})
    run = rt.workflows.wait_for_completion(run.id, timeout=60)
```

`AsyncAgentRuntime` has the same methods, awaited. See docs/client.md.
"""

from stevora.client.async_ import AsyncAgentRuntime
from stevora.client.errors import (
    AuthenticationFailed,
    Conflict,
    InvalidStateTransition,
    InvalidToolOutputs,
    NotFound,
    RateLimited,
    ServerError,
    SignalMismatch,
    StevoraAPIError,
    StevoraClientError,
    StevoraConnectionError,
    StevoraTimeoutError,
    ToolOutputTooLarge,
    ValidationFailed,
    WaitTimeout,
)
from stevora.client.models import (
    RUN_STATUSES,
    TERMINAL_STATUSES,
    ApiKey,
    ApprovalRequest,
    CostCall,
    CostSummary,
    CreatedApiKey,
    CreatedWebhook,
    DefinitionRef,
    Event,
    Health,
    LlmCall,
    ModelCost,
    Page,
    PageMeta,
    PendingToolCall,
    RequiredAction,
    RunCost,
    StepRun,
    ToolTrace,
    Webhook,
    WebhookDelivery,
    WorkflowDefinition,
    WorkflowRun,
    Workspace,
)
from stevora.client.sync import AgentRuntime
from stevora.client.tool_outputs import ToolOutput

__all__ = [
    "RUN_STATUSES",
    "TERMINAL_STATUSES",
    "AgentRuntime",
    "ApiKey",
    "ApprovalRequest",
    "AsyncAgentRuntime",
    "AuthenticationFailed",
    "Conflict",
    "CostCall",
    "CostSummary",
    "CreatedApiKey",
    "CreatedWebhook",
    "DefinitionRef",
    "Event",
    "Health",
    "InvalidStateTransition",
    "InvalidToolOutputs",
    "LlmCall",
    "ModelCost",
    "NotFound",
    "Page",
    "PageMeta",
    "PendingToolCall",
    "RateLimited",
    "RequiredAction",
    "RunCost",
    "ServerError",
    "SignalMismatch",
    "StepRun",
    "StevoraAPIError",
    "StevoraClientError",
    "StevoraConnectionError",
    "StevoraTimeoutError",
    "ToolOutput",
    "ToolOutputTooLarge",
    "ToolTrace",
    "ValidationFailed",
    "WaitTimeout",
    "Webhook",
    "WebhookDelivery",
    "WorkflowDefinition",
    "WorkflowRun",
    "Workspace",
]
