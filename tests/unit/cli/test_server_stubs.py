"""A client-only install (no `server` extra): the process commands name the extra to install, in
their help as well as when run."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from stevora.cli import SERVER_COMMANDS, _register_server_stubs


@pytest.fixture
def client_only_app() -> typer.Typer:
    app = typer.Typer(name="stevora", add_completion=False)
    _register_server_stubs("fastapi", into=app)
    return app


@pytest.mark.parametrize("command", SERVER_COMMANDS)
def test_each_stub_names_the_server_extra_in_its_help_and_when_run(
    client_only_app: typer.Typer, command: str
) -> None:
    runner = CliRunner()
    shown = runner.invoke(client_only_app, [command, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "pip install 'stevora[server]'" in shown.output, shown.output
    ran = runner.invoke(client_only_app, [command], env={"COLUMNS": "200"})
    assert ran.exit_code == 2
    assert "pip install 'stevora[server]'" in ran.output and "missing module 'fastapi'" in ran.output


def test_the_command_list_names_the_server_extra(client_only_app: typer.Typer) -> None:
    listed = CliRunner().invoke(client_only_app, ["--help"], env={"COLUMNS": "200"})
    assert listed.output.count("pip install 'stevora[server]'") == len(SERVER_COMMANDS), listed.output
