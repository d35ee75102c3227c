"""Dagu's file of several workflows (issue 22): `stevora definitions apply` and `stevora run` take
a YAML file whose `---`-separated documents are a main workflow and the workflows it calls as
tools, by bare name or as `{name, workflow}`, in any order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stevora.ids import new_id
from stevora.tasks import StepResult
from tests.conftest import Harness
from tests.integration.cli.conftest import Cli


def dagu_file(folder: Path, main: str, calculator: str, explainer: str) -> Path:
    path = folder / "agent.yaml"
    path.write_text(
        f"""\
name: {main}
version: 1
steps:
  - type: llm
    name: agent
    model: scripted
    messages: [{{role: user, content: "What is 6 times 7?"}}]
    tools:
      - {calculator}
      - {{name: explain, workflow: {explainer}}}
---
name: {calculator}
version: 1
description: Do arithmetic on two numbers
defaultParams: operation a b
steps:
  - {{type: task, name: compute, handler: compute}}
---
name: {explainer}
version: 1
description: Explain a result
defaultParams: topic
steps:
  - {{type: task, name: compute, handler: compute}}
---
"""
    )
    return path


async def test_a_file_of_several_workflows_applies_and_runs(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    """Fails where such a file is refused with "expected a single document"."""
    ran: list[dict[str, Any]] = []

    async def compute(ctx: Any) -> StepResult:
        ran.append(dict(ctx.workflow_input))
        return StepResult(state_updates={"result": 42})

    harness.tasks.register("compute", compute)
    main, calculator, explainer = new_id("main"), new_id("calculator"), new_id("explain")
    path = dagu_file(tmp_path, main, calculator, explainer)

    applied = await cli("definitions", "apply", str(path))
    assert applied.exit_code == 0, applied.output
    ids = applied.stdout.split()
    assert len(ids) == 3 and all(i.startswith("wfdef_") for i in ids)
    names = [
        await harness.rt.pool.fetchval("SELECT name FROM workflow_definitions WHERE id = $1", i) for i in ids
    ]
    assert names == [main, calculator, explainer]  # printed in file order
    again = await cli("definitions", "apply", str(path))
    assert again.stdout.split() == ids  # unchanged: no-ops

    watched = await cli("run", str(path), "--watch")
    assert watched.exit_code == 0, watched.output
    assert main in watched.output  # the file's first workflow is the one that runs
    assert len(ran) == 2  # the model called both workflows


async def test_a_document_that_is_not_a_definition_is_named(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: a\nversion: '1'\nsteps: [{type: wait, name: w, durationMs: 1}]\n---\n- just\n- a list\n"
    )
    result = await cli("definitions", "apply", str(path))
    assert result.exit_code != 0
    assert "document 2" in result.output
