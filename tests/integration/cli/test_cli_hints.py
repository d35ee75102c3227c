"""`stevora runs show` of a run waiting for approval prints the `approve` command, as it prints
`runs tool-outputs` for client tools."""

from __future__ import annotations

import re
from typing import Any

from stevora.ids import new_id
from tests.conftest import Harness, create_definition
from tests.integration.cli.conftest import Cli


async def test_runs_show_of_a_run_waiting_for_approval_gives_the_approve_command(
    cli: Cli, harness: Harness, workspace_id: str
) -> None:
    async def draft(ctx: Any) -> dict[str, Any]:
        return {"status": "completed", "stateUpdates": {"email": "Welcome!"}}

    harness.tasks.register("draft", draft)
    steps = [
        {"type": "task", "name": "draft", "handler": "draft"},
        {"type": "approval", "name": "review", "contentKey": "email"},
    ]
    definition_id = await create_definition(
        harness.rt, workspace_id, {"name": new_id("wf"), "version": "1", "steps": steps}
    )
    started = await cli("run", definition_id)
    run_id = re.search(r"wfrun_[0-9a-z]+", started.output).group(0)  # type: ignore[union-attr]
    await harness.wait_for_status(run_id, "WAITING")
    approval_id = await harness.value_when_set(
        "SELECT id FROM approval_requests WHERE workflow_run_id = $1", run_id
    )

    shown = await cli("runs", "show", run_id)
    assert shown.exit_code == 0, shown.output
    assert f"stevora approve {approval_id}" in shown.output
    assert "review waiting for approval" in shown.output
