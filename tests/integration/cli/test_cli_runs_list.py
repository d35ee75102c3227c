"""`stevora runs list` names each run's definition and filters by a definition's name (every
version), not only by id."""

from __future__ import annotations

import json

from stevora.ids import new_id
from tests.conftest import Harness, create_definition
from tests.integration.cli.conftest import Cli


async def test_runs_list_shows_the_definition_name_and_filters_by_it(
    cli: Cli, harness: Harness, workspace_id: str
) -> None:
    harness.tasks.register("noop", lambda ctx: None)
    steps = [{"type": "task", "name": "t", "handler": "noop"}]
    name, other = new_id("billing"), new_id("shipping")
    ids = {
        (n, v): await create_definition(harness.rt, workspace_id, {"name": n, "version": v, "steps": steps})
        for n, v in ((name, "1"), (name, "2"), (other, "1"))
    }
    runs = {}
    for key, definition_id in ids.items():
        started = await cli("run", definition_id)
        assert started.exit_code == 0, started.output
        runs[key] = started.output.split()[1]
        await harness.wait_for_status(runs[key], "COMPLETED")

    listed = await cli("runs", "list", "--definition", name, env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert "2 total" in listed.output and "Definition" in listed.output
    assert f"{name} v1" in listed.output and f"{name} v2" in listed.output
    assert other not in listed.output and runs[(other, "1")] not in listed.output

    as_json = json.loads((await cli("runs", "list", "--definition", other, "--json")).stdout)
    assert [(r["id"], r["definition"]) for r in as_json["data"]] == [
        (runs[(other, "1")], {"name": other, "version": "1"})
    ]
