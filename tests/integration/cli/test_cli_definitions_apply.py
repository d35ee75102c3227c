"""`stevora definitions apply`: a file that differs from the stored version in any way (a field
removed included) is a CONFLICT, or with `--new-version` the next version; never the old one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stevora.cli.remote import next_version
from stevora.ids import new_id
from tests.conftest import Harness
from tests.integration.cli.conftest import Cli


def _llm_definition(name: str, **step: Any) -> dict[str, Any]:
    llm = {"type": "llm", "name": "answer", "model": "gpt-4o",
           "messages": [{"role": "user", "content": "{{input.question}}"}], **step}  # fmt: skip
    return {"name": name, "version": "1.0.0", "steps": [llm]}


def _write(path: Path, definition: dict[str, Any]) -> Path:
    path.write_text(json.dumps(definition))
    return path


async def test_a_removed_field_is_a_conflict_not_the_old_definition(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    name = new_id("wf")
    path = tmp_path / "agent.json"
    _write(path, _llm_definition(name, systemPrompt="You are a pirate."))
    first = await cli("definitions", "apply", str(path))
    assert first.exit_code == 0, first.output
    definition_id = first.stdout.strip().splitlines()[-1]

    # The same file again, and with a default written out: unchanged, same id.
    again = await cli("definitions", "apply", str(path))
    assert again.stdout.strip().splitlines()[-1] == definition_id
    defaults = _llm_definition(name, systemPrompt="You are a pirate.")
    defaults["description"] = None
    _write(path, defaults)
    assert (await cli("definitions", "apply", str(path))).stdout.strip().splitlines()[-1] == definition_id

    _write(path, _llm_definition(name))  # systemPrompt deleted from the file
    removed = await cli("definitions", "apply", str(path))
    assert removed.exit_code == 1, removed.output
    assert "CONFLICT" in removed.output and "systemPrompt" in removed.output, removed.output

    bumped = await cli("definitions", "apply", str(path), "--new-version")
    assert bumped.exit_code == 0, bumped.output
    assert "v1.0.1" in bumped.output
    new_id_ = bumped.stdout.strip().splitlines()[-1]
    assert new_id_ != definition_id
    steps = json.loads(
        await harness.rt.pool.fetchval("SELECT steps::text FROM workflow_definitions WHERE id = $1", new_id_)
    )
    assert "systemPrompt" not in steps[0]
    # Applying the bumped content again finds 1.0.1 equal: no 1.0.2.
    twice = await cli("definitions", "apply", str(path), "--new-version")
    assert twice.stdout.strip().splitlines()[-1] == new_id_


async def test_an_added_step_field_is_a_conflict(cli: Cli, tmp_path: Path) -> None:
    name = new_id("wf")
    path = _write(tmp_path / "agent.json", _llm_definition(name))
    assert (await cli("definitions", "apply", str(path))).exit_code == 0
    _write(path, _llm_definition(name, temperature=0.2))
    added = await cli("definitions", "apply", str(path))
    assert added.exit_code == 1 and "temperature" in added.output, added.output


def test_next_version_counts_up_the_last_number() -> None:
    assert next_version("1.0.0") == "1.0.1"
    assert next_version("1") == "2"
    assert next_version("v2-beta") == "v3-beta"
    assert next_version("draft") == "draft.1"
