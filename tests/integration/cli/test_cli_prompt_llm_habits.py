"""`stevora prompt` for simonw/llm users (issue 22): tools from a file path, a clear error for a
module that registers none, the local module's tools (not the server's) with `--url`, y/n/edit
at the terminal for each call, and `--continue` / `--conversation` with the whole transcript."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

from stevora.cli.prompt import PROMPT_DEFINITION
from stevora.ids import new_id
from tests.conftest import Harness
from tests.integration.cli.conftest import Cli


def tools_file(folder: Path, body: str) -> tuple[Path, str]:
    """A tools module under a unique name (modules stay imported in this process)."""
    name = new_id("my_tools")
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path, name


def lookup_file(folder: Path) -> tuple[Path, str]:
    return tools_file(
        folder,
        f"""\
        from stevora.tools import tool

        @tool(name="{new_id("lookup")}")
        def lookup(city: str) -> str:
            \"\"\"Look a city up.\"\"\"
            return f"local answer for {{city}}"
        """,
    )


def tool_name(path: Path) -> str:
    return path.read_text().split('name="')[1].split('"')[0]


def flat(output: str) -> str:
    """The output with the error box's frame and line breaks gone."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


async def newest_run(harness: Harness) -> Any:
    return await harness.rt.pool.fetchrow(
        "SELECT r.* FROM workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id "
        "WHERE d.name = $1 ORDER BY r.created_at DESC LIMIT 1",
        PROMPT_DEFINITION,
    )


async def test_tools_from_a_file_path_run_here_not_the_servers_tool_of_that_name(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    """Fails where a path is a ModuleNotFoundError traceback, and where the server's tool runs."""
    path, _ = lookup_file(tmp_path)
    name = tool_name(path)
    server_calls: list[Any] = []
    harness.tools.register(name, lambda input: server_calls.append(input) or "server answer")
    result = await cli("prompt", "Weather in Lisbon?", "--model", "scripted", "--tools", str(path))
    assert result.exit_code == 0, result.output
    assert "local answer for" in result.output
    assert server_calls == []  # the server's tool of the same name never ran
    assert "the server's tools of these names are not used" in result.output
    run = await newest_run(harness)
    trace = await harness.rt.pool.fetchrow("SELECT * FROM tool_trace WHERE workflow_run_id = $1", run["id"])
    assert trace["tool_name"] == name and trace["status"] == "completed"
    assert "local answer for" in trace["output_json"]


async def test_a_module_that_registers_no_tools_is_an_error_that_says_why(cli: Cli, tmp_path: Path) -> None:
    undecorated, _ = tools_file(tmp_path, "def add(a: int, b: int) -> int:\n    return a + b\n")
    result = await cli("prompt", "2+2?", "--model", "scripted", "--tools", str(undecorated))
    assert result.exit_code == 2
    assert "registers no tools: its functions (add) are not registered" in flat(result.output)
    assert "@tool" in result.output
    empty, _ = tools_file(tmp_path, "X = 1\n")
    result = await cli("prompt", "2+2?", "--model", "scripted", "--tools", str(empty))
    assert result.exit_code == 2 and "defines no functions" in flat(result.output)
    missing = await cli("prompt", "2+2?", "--model", "scripted", "--tools", str(tmp_path / "nope.py"))
    assert missing.exit_code == 2 and "No tools file" in flat(missing.output)
    assert "Traceback" not in missing.output


async def test_approve_each_asks_before_every_call_and_an_edit_changes_the_arguments(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    path, _ = lookup_file(tmp_path)
    result = await cli(
        "prompt", "Weather?", "--model", "scripted", "--tools", str(path), "--approve-each",
        input='e\n{"city": "Porto"}\n',
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "run it? [y]es / [n]o / [e]dit" in result.output
    assert "local answer for Porto" in result.output

    declined = await cli(
        "prompt", "Weather?", "--model", "scripted", "--tools", str(path), "--approve-each", input="n\n"
    )
    assert declined.exit_code == 0, declined.output
    run = await newest_run(harness)
    trace = await harness.rt.pool.fetchrow("SELECT * FROM tool_trace WHERE workflow_run_id = $1", run["id"])
    assert trace["status"] == "failed" and trace["error"] == "The user declined this call"


async def test_a_gated_server_tool_is_approved_at_the_terminal(cli: Cli, harness: Harness) -> None:
    """Fails where the prompt prints "waiting for approval — stevora approve apr_..." and blocks."""
    ran: list[dict[str, Any]] = []
    harness.tools.register(
        "refund",
        lambda input: ran.append(input) or "refunded",
        description="Refund an order",
        parameters={"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]},
        requires_approval=True,
    )
    result = await cli(
        "prompt", "Refund it", "--model", "scripted", "--tool", "refund", input='e\n{"order": "A-1"}\n'
    )
    assert result.exit_code == 0, result.output
    assert ran == [{"order": "A-1"}]
    assert "stevora approve" not in result.output


async def test_continue_carries_the_whole_earlier_exchange_and_runs_nothing_again(
    cli: Cli, harness: Harness, tmp_path: Path
) -> None:
    """Fails where every prompt starts fresh (llm's `-c`)."""
    path, _ = lookup_file(tmp_path)
    first = await cli(
        "prompt", "My name is Ada. Weather in Lisbon?", "--model", "scripted", "--tools", str(path)
    )
    assert first.exit_code == 0, first.output
    first_run = await newest_run(harness)

    second = await cli("prompt", "What is my name?", "--model", "scripted", "--continue")
    assert second.exit_code == 0, second.output
    sent = harness.scripted.requests[-1].messages
    texts = [(m.role, m.content or "") for m in sent]
    assert texts[0] == ("user", "My name is Ada. Weather in Lisbon?")
    assert texts[1][0] == "assistant" and "local answer for" in texts[1][1]  # the tool call, recorded
    assert texts[-1] == ("user", "What is my name?")
    second_run = await newest_run(harness)
    assert second_run["id"] != first_run["id"]
    traces = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", second_run["id"]
    )
    assert traces == 0  # nothing of the earlier exchange ran again

    # --conversation picks any earlier run: the third turn carries both earlier ones.
    third = await cli("prompt", "And again?", "--model", "scripted", "--conversation", second_run["id"])
    assert third.exit_code == 0, third.output
    contents = [m.content for m in harness.scripted.requests[-1].messages]
    assert contents[0] == "My name is Ada. Weather in Lisbon?" and contents[2] == "What is my name?"
    assert contents[-1] == "And again?"
