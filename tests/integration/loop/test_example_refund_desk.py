"""`examples/refund-desk.json` end to end: a tool step, an approval-gated tool, a global tool that
writes state — with the example's real handlers (`examples/refund_desk.py`, `examples/memory.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import examples.memory as memory
import examples.refund_desk as refund_desk
from stevora.engine import commands
from stevora.engine.steps.approval import decide_approval
from tests.conftest import Harness, create_definition

ROOT = Path(__file__).resolve().parents[3]


async def test_the_refund_desk_example_runs_with_a_person_approving_the_refund(
    harness: Harness, workspace_id: str
) -> None:
    harness.tools.register("lookup_order", refund_desk.lookup_order, parameters={
        "type": "object", "properties": {"orderId": {"type": "string"}}, "required": ["orderId"],
    })  # fmt: skip
    harness.tools.tool(requires_approval=True)(refund_desk.issue_refund)
    harness.tools.tool(global_=True)(memory.remember)
    spec = json.loads((ROOT / "examples" / "refund-desk.json").read_text())
    spec["steps"][1]["model"] = "scripted"
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"orderId": "ord_1042"})
    await harness.wait_for_status(run["id"], "WAITING")

    waiting = await harness.rt.pool.fetchrow(
        "SELECT state, input FROM workflow_runs WHERE id = $1", run["id"]
    )
    assert waiting["input"] == {"orderId": "ord_1042", "reason": "not stated"}  # inputSchema default
    assert waiting["state"]["order"]["amount"] == 120
    assert waiting["state"]["orderLookedUpBy"].endswith(":tool")
    offered = await harness.rt.pool.fetchval(
        "SELECT request -> 'tools' FROM llm_calls WHERE workflow_run_id = $1 AND round = 1", run["id"]
    )
    assert offered == ["issue_refund", "remember"], "the global tool is offered beside the step's own"
    first_call = await harness.rt.pool.fetchval(
        "SELECT response -> 'toolCalls' FROM llm_calls WHERE workflow_run_id = $1 AND round = 1", run["id"]
    )
    assert [c["name"] for c in first_call] == ["issue_refund"], "toolChoice forced the first call"
    approval = await harness.rt.pool.fetchrow(
        "SELECT id, content FROM approval_requests WHERE workflow_run_id = $1 AND status = 'PENDING'",
        run["id"],
    )
    assert approval["content"]["tool"] == "issue_refund"

    await decide_approval(
        harness.rt, workspace_id, approval["id"], "edited", {"orderId": "ord_1042", "amount": 100}, "ann"
    )
    done = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]
    refund = await harness.rt.pool.fetchrow(
        "SELECT output_json FROM tool_trace WHERE workflow_run_id = $1 AND tool_name = 'issue_refund'",
        run["id"],
    )
    assert refund["output_json"] == {"orderId": "ord_1042", "refunded": 100, "currency": "EUR"}
