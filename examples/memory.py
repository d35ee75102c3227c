"""A global tool (`@tool(global_=True)`): every `llm` step is offered it, after its own tools.

`make dev` does not load it: every example's agent would be offered it, and the offline scripted
model (which calls each tool it is offered once) would call it in every example. To try it:

    stevora dev --tools examples.tools --tools examples.refund_desk --tools examples.memory
    stevora run examples/refund-desk.json -i orderId=ord_1042 --watch   # offered: issue_refund, remember
"""

from __future__ import annotations

from stevora import ToolContext, tool


@tool(global_=True)
async def remember(fact: str, ctx: ToolContext) -> str:
    """Keep a fact about this conversation in the run's state."""
    ctx.update_state({"facts": [*ctx.state.get("facts", []), fact]})
    return "remembered"
