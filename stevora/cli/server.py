"""Process commands: migrate, api, worker, dev, demo, and `runs prune` (talks to PostgreSQL directly)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from stevora.cli import app
from stevora.cli.output import make_console
from stevora.cli.remote import runs_app
from stevora.llm.providers import keyless
from stevora.logging import configure_logging
from stevora.settings import Settings

console = make_console(stderr=True)


def _settings(**overrides: object) -> Settings:
    settings = Settings()
    clean = {k: v for k, v in overrides.items() if v is not None}
    settings = settings.model_copy(update=clean) if clean else settings
    configure_logging(settings)
    return settings


def _importable(modules: list[str]) -> None:
    """Import the --tools modules here so a typo is one clear line, not a worker traceback."""
    import importlib
    import os
    import sys

    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as the worker does: the working directory is importable
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            console.print(
                f"[red]error[/red] cannot import --tools module '{name}': {exc}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(2) from None


@app.command()
def migrate(
    database_url: Annotated[str | None, typer.Option(help="Overrides STEVORA_DATABASE_URL")] = None,
) -> None:
    """Bring the database schema to the newest revision (Alembic upgrade head)."""
    from stevora.db.migrate import upgrade_head

    settings = _settings(database_url=database_url)
    upgrade_head(settings.database_url)
    console.print("[green]database is up to date[/green]")


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Bind address (STEVORA_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (STEVORA_PORT, default 3000)")] = None,
    workers: Annotated[int, typer.Option(help="API processes sharing the port (SO_REUSEPORT)")] = 1,
) -> None:
    """Serve the HTTP API and the web UI (uvicorn)."""
    from stevora.api.serve import serve

    serve(_settings(host=host, port=port), workers=workers)


def _with_mcp_config(settings: Settings, path: Path | None) -> Settings:
    """The settings with `--mcp-config`, after checking the file: a bad one is one clear line."""
    from stevora.mcp import McpConfigError, load_mcp_config

    if path is not None:
        settings = settings.model_copy(update={"mcp_config": str(path)})
    if settings.mcp_config:
        try:
            load_mcp_config(settings.mcp_config)
        except McpConfigError as exc:
            console.print(f"[red]error[/red] {exc}", markup=True, highlight=False)
            raise typer.Exit(2) from None
    return settings


@app.command()
def worker(
    tools: Annotated[
        list[str] | None,
        typer.Option("--tools", help="Module to import at start (its register_tool / @tool calls)"),
    ] = None,
    processes: Annotated[int | None, typer.Option(help="Worker processes (STEVORA_WORKER_PROCESSES)")] = None,
    threads: Annotated[int | None, typer.Option(help="Threads per process (STEVORA_WORKER_THREADS)")] = None,
    mcp_config: Annotated[
        Path | None,
        typer.Option(
            "--mcp-config", help="The worker's MCP servers: an mcpServers JSON file (STEVORA_MCP_CONFIG)"
        ),
    ] = None,
) -> None:
    """Run worker process(es) that execute workflow runs from the broker queue."""
    from workers.main import run  # the CLI is the process edge that starts workers

    settings = _with_mcp_config(_settings(), mcp_config)
    if tools:
        settings = settings.model_copy(update={"tool_modules": [*settings.tool_modules, *tools]})
    _importable(settings.tool_modules)
    raise typer.Exit(
        run(
            settings,
            processes=processes or settings.worker_processes,
            threads=threads or settings.worker_threads,
        )
    )


@app.command()
def dev(
    port: Annotated[int, typer.Option(help="API port")] = 3000,
    data_dir: Annotated[Path | None, typer.Option(help="Where embedded PostgreSQL keeps its data")] = None,
    tools: Annotated[
        list[str] | None, typer.Option("--tools", help="Module with your tools / task handlers")
    ] = None,
    stop: Annotated[
        bool,
        typer.Option(
            "--stop",
            help="Stop what runs on the data folder (a `stevora dev` still running, or an embedded "
            "PostgreSQL left behind) and exit",
        ),
    ] = False,
    mcp_config: Annotated[
        Path | None,
        typer.Option(
            "--mcp-config", help="The worker's MCP servers: an mcpServers JSON file (STEVORA_MCP_CONFIG)"
        ),
    ] = None,
) -> None:
    """Embedded PostgreSQL + in-process broker and worker + the API, on localhost."""
    from stevora.devstack import DevStack, PortInUse, bind_api_socket, exit_on_sigterm, stop_dev

    settings = _settings(data_dir=str(data_dir) if data_dir else None)
    if stop:
        done, stopped = stop_dev(Path(settings.data_dir))
        for line in done:
            console.print(line)
        raise typer.Exit(0 if stopped else 1)
    if tools:
        settings = settings.model_copy(update={"tool_modules": [*settings.tool_modules, *tools]})
    _importable(settings.tool_modules)
    settings = _with_mcp_config(settings, mcp_config)
    stack = DevStack(settings, port=port)
    try:
        sock = bind_api_socket(stack.host, port)
    except PortInUse as exc:
        console.print(f"[bold red]error:[/bold red] {exc}")
        raise typer.Exit(1) from None
    exit_on_sigterm()
    try:
        stack.start_backend()
        if stack.notice:
            console.print(f"[yellow]note:[/yellow] {stack.notice}")
        console.print(f"[bold green]Stevora is running[/bold green] at {stack.url}  (UI: {stack.url}/ui)")
        console.print(f"API docs: {stack.url}/docs   Prometheus metrics: {stack.url}/metrics")
        console.print(f"API key: [bold]{stack.api_key}[/bold]   data: {Path(settings.data_dir).resolve()}")
        stack.serve(sock)
    finally:
        stack.stop()
        sock.close()


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="API port for the demo (0: any free port)")] = 0,
    data_dir: Annotated[Path | None, typer.Option(help="Where embedded PostgreSQL keeps its data")] = None,
) -> None:
    """Start the embedded stack, run the example workflows end to end and print their timelines."""
    import os

    from stevora.cli.demo import EXAMPLE_TOOLS, run_demo
    from stevora.devstack import DevStack, exit_on_sigterm

    settings = _settings(
        data_dir=str(data_dir) if data_dir else None,
        tool_modules=[EXAMPLE_TOOLS],
        log_level=os.environ.get("STEVORA_LOG_LEVEL", "WARNING"),
    )
    if port == 0:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    stack = DevStack(settings, port=port)
    exit_on_sigterm()
    try:
        stack.start_backend()
        if stack.notice:
            console.print(f"[yellow]note:[/yellow] {stack.notice}")
        stack.start_api_in_thread()
        ok = run_demo(
            stack.url,
            stack.api_key,
            Path(settings.data_dir) / "dev-api-key",
            offline=keyless(settings),
        )
    finally:
        stack.stop()
    raise typer.Exit(0 if ok else 1)


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w` → a timedelta (a bare number is days)."""
    value = text.strip().lower()
    unit = value[-1] if value and value[-1] in _DURATION_UNITS else "d"
    number = value[:-1] if value and value[-1] in _DURATION_UNITS else value
    try:
        amount = float(number)
    except ValueError:
        raise typer.BadParameter(f"'{text}' is not a duration like 30d, 12h or 90m") from None
    if amount <= 0:
        raise typer.BadParameter("the duration must be positive")
    return timedelta(seconds=amount * _DURATION_UNITS[unit])


@runs_app.command("prune")
def runs_prune(
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", help="Finished longer ago than this: 30d, 12h (STEVORA_RETENTION_DAYS)"),
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option("--status", help="Only runs that ended so: COMPLETED, FAILED, CANCELLED"),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing")
    ] = False,
    batch_size: Annotated[int, typer.Option(help="Runs per transaction")] = 500,
    database_url: Annotated[str | None, typer.Option(help="Overrides STEVORA_DATABASE_URL")] = None,
) -> None:
    """Delete finished runs (events, steps, LLM calls, traces, approvals, child runs) past retention.

    Talks to PostgreSQL directly (like `migrate`), in batches that never block live runs."""
    import asyncio

    from stevora.db.database import create_pool
    from stevora.db.retention import prune_finished_runs

    settings = _settings(database_url=database_url)
    if older_than is not None:
        age = parse_duration(older_than)
    elif settings.retention_days:
        age = timedelta(days=settings.retention_days)
    else:
        raise typer.BadParameter(
            "give --older-than (or set STEVORA_RETENTION_DAYS)", param_hint="--older-than"
        )

    async def prune() -> int:
        pool = await create_pool(settings.database_url, max_size=2)
        try:
            return await prune_finished_runs(pool, age, status or None, batch_size, dry_run=dry_run)
        finally:
            await pool.close()

    try:
        count = asyncio.run(prune())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--status") from None
    verb = "would delete" if dry_run else "deleted"
    console.print(f"{verb} {count} finished run(s) older than {age}")
