"""Tools for `examples/refund-desk.json`: tools that act on the run (`make dev` loads this module
next to `examples.tools`: `--tools examples.tools --tools examples.refund_desk`).

* `lookup_order` runs as a `tool` step (no model), its typed output going to state;
* `issue_refund` is approval-gated: the model asks, a person approves, edits or rejects;
  its pydantic return type is its output schema.

The global tool of this example, `remember`, is in `examples/memory.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from stevora import ToolContext, register_tool, tool

ORDERS = {
    "ord_1042": {
        "orderId": "ord_1042",
        "customer": "Acme Corp",
        "amount": 120,
        "currency": "EUR",
        "days": 12,
    },
}


async def lookup_order(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Find an order by id (and note in the run's state that it was looked up)."""
    order = ORDERS.get(input["orderId"]) or {**ORDERS["ord_1042"], "orderId": input["orderId"]}
    ctx.update_state({"orderLookedUpBy": ctx.idempotency_key})
    return order


register_tool(
    "lookup_order",
    lookup_order,
    parameters={"type": "object", "properties": {"orderId": {"type": "string"}}, "required": ["orderId"]},
)


class Refund(BaseModel):
    orderId: str
    refunded: int
    currency: str


@tool(requires_approval=True)
async def issue_refund(orderId: str, amount: int, ctx: ToolContext) -> Refund:
    """Refund an order (a person approves each refund before it is issued)."""
    # A real handler would pass ctx.idempotency_key to the payment provider.
    return Refund(
        orderId=orderId, refunded=amount, currency=str(ctx.state.get("order", {}).get("currency", "EUR"))
    )
