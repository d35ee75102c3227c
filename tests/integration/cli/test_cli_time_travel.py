"""`stevora runs checkpoints | fork | diff | replay` against a real server, the fake model through
the OpenAI SDK, and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import stevora.cli.time_travel  # noqa: F401  (registers its commands)
from stevora.engine import commands
from stevora.testing.fake_llm import FakeLLMServer
from stevora.tools import ToolContext
from tests.conftest import Harness, create_definition
from tests.integration.cli.conftest import Cli
from tests.integration.loop.conftest import SdkProviders, fake, fake_llm_session, llm_step, sdk  # noqa: F401
from tests.integration.loop.test_time_travel import _five_rounds


def _lookup(harness: Harness) -> list[int]:
    """Register the `lookup` tool; the list of the n it ran for (its side-effect log)."""
    ran: list[int] = []

    @harness.tools.tool
    async def lookup(n: int, ctx: ToolContext) -> str:
        """Look n up."""
        ran.append(n)
        return f"result {n}"

    return ran


async def test_fork_from_the_cli_then_diff_marks_the_edited_round(
    cli: Cli,
    harness: Harness,
    workspace_id: str,
    sdk: SdkProviders,  # noqa: F811
    fake: FakeLLMServer,  # noqa: F811
) -> None:
    _lookup(harness)
    _five_rounds(fake)
    spec = {"name": "tt-cli", "version": "1", "steps": [llm_step(tools=["lookup"])]}
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "go"})
    await harness.wait_for_status(run["id"], "COMPLETED")
    origin = run["id"]

    listed = await cli("runs", "checkpoints", origin, "--json")
    assert listed.exit_code == 0, listed.output
    assert [p["at"] for p in json.loads(listed.output)] == [
        f"agent{r}" for r in ["", ":1", ":2", ":3", ":4", ":5"]
    ]

    made = await cli(
        "runs",
        "fork",
        origin,
        "--at",
        "agent:3",
        "--set",
        "flag=true",
        "--tool-result",
        'call_2="EDITED"',
        "--json",
    )
    assert made.exit_code == 0, made.output
    fork: dict[str, Any] = json.loads(made.output)
    assert fork["forkedFrom"] == {"runId": origin, "stepName": "agent", "round": 3}
    assert fork["edits"] == {"state": {"flag": True}, "toolResults": {"call_2": "EDITED"}}
    await harness.wait_for_status(fork["id"], "COMPLETED")

    diffed = await cli("runs", "diff", origin, fork["id"], "--json")
    assert diffed.exit_code == 0, diffed.output
    rows = json.loads(diffed.output)
    assert [(r["round"], r["same"], r["firstDivergence"]) for r in rows] == [
        (1, True, False),
        (2, False, True),  # the edited result of round 2
        (3, True, False),
        (4, True, False),
        (5, True, False),
    ]
    assert rows[1]["a"]["results"] == ["result 2"] and rows[1]["b"]["results"] == ["EDITED"]
    text = await cli("runs", "diff", origin, fork["id"])
    assert "agent:2  ≠ first divergence" in text.output, text.output

    bad = await cli("runs", "fork", origin, "--at", "agent:3", "--tool-result", 'call_1="x"')
    assert bad.exit_code != 0 and "edits.toolResults.call_1" in bad.output, bad.output
    bad_set = await cli("runs", "fork", origin, "--at", "agent:3", "--set", "flag")
    assert bad_set.exit_code != 0 and "--set" in bad_set.output, bad_set.output

    # Another version of the definition from the fork point on.
    v2 = {**spec, "version": "2", "steps": [llm_step(tools=["lookup"], systemPrompt="v2")]}
    v2_id = await create_definition(harness.rt, workspace_id, v2)
    other = await cli("runs", "fork", origin, "--at", "agent:3", "--definition-version", "2", "--json")
    assert other.exit_code == 0, other.output
    forked = json.loads(other.output)
    assert forked["edits"] == {"definitionVersion": "2"} and forked["definitionId"] == v2_id


async def test_bulk_replay_prints_the_comparison_and_bulk_retry_counts_first(
    cli: Cli,
    harness: Harness,
    workspace_id: str,
    sdk: SdkProviders,  # noqa: F811
    fake: FakeLLMServer,  # noqa: F811
) -> None:
    ran = _lookup(harness)
    _five_rounds(fake)
    spec = {"name": "tt-bulk", "version": "1", "steps": [llm_step(tools=["lookup"])]}
    def_id = await create_definition(harness.rt, workspace_id, spec)
    origins = []
    for _ in range(3):
        run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "go"})
        await harness.wait_for_status(run["id"], "COMPLETED")
        origins.append(run["id"])
    ran.clear()

    made = await cli(
        "runs", "replay", "--definition", "tt-bulk", "--last", "2", "--model", "gpt-4.1-mini", "--json"
    )
    assert made.exit_code == 0, made.output
    out = json.loads(made.output)
    assert [r["runId"] for r in out["replays"]] == [origins[2], origins[1]]
    comparison = out["comparison"]
    assert comparison["done"] is True  # it waited for the replays to end
    assert [(r["origin"]["rounds"], r["replay"]["rounds"]) for r in comparison["runs"]] == [(5, 5), (5, 5)]
    assert [r["replay"]["toolCalls"]["matched"] for r in comparison["runs"]] == [4, 4]
    assert ran == []  # recorded tools: no handler ran
    table = await cli("runs", "replay", origins[0], origins[1])
    assert table.exit_code == 0, table.output
    assert "COMPLETED → COMPLETED" in table.output and "5 → 5" in table.output and "4/0" in table.output

    # Bulk retry: nothing of this definition failed.
    dry = await cli("runs", "retry", "--failed", "--definition", "tt-bulk", "--dry-run")
    assert dry.exit_code == 0 and "0 FAILED run(s) would be retried" in dry.output, dry.output
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET status = 'FAILED', failed_at = now() WHERE id = $1", origins[0]
    )
    dry = await cli(
        "runs", "retry", "--failed", "--definition", "tt-bulk", "--since", "2020-01-01", "--dry-run", "--json"
    )
    assert json.loads(dry.output)["runIds"] == [origins[0]]
    needs = await cli("runs", "retry", "--failed")
    assert needs.exit_code != 0 and "--definition" in needs.output, needs.output
