"""Process commands: migrate, api, worker, dev, demo."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stevora.cli import app
from stevora.logging import configure_logging
from stevora.settings import Settings

console = Console(stderr=True)


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


@app.command()
def worker(
    tools: Annotated[
        list[str] | None,
        typer.Option("--tools", help="Module to import at start (its register_tool / @tool calls)"),
    ] = None,
    processes: Annotated[int | None, typer.Option(help="Worker processes (STEVORA_WORKER_PROCESSES)")] = None,
    threads: Annotated[int | None, typer.Option(help="Threads per process (STEVORA_WORKER_THREADS)")] = None,
) -> None:
    """Run worker process(es) that execute workflow runs from the broker queue."""
    from workers.main import run  # the CLI is the process edge that starts workers

    settings = _settings()
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
) -> None:
    """Embedded PostgreSQL + in-process broker and worker + the API, on localhost."""
    from stevora.devstack import DevStack

    settings = _settings(data_dir=str(data_dir) if data_dir else None)
    if tools:
        settings = settings.model_copy(update={"tool_modules": [*settings.tool_modules, *tools]})
    _importable(settings.tool_modules)
    stack = DevStack(settings, port=port)
    stack.start_backend()
    server = stack.make_server()
    console.print(f"[bold green]Stevora is running[/bold green] at {stack.url}  (UI: {stack.url}/ui)")
    console.print(f"API key: [bold]{stack.api_key}[/bold]   data: {Path(settings.data_dir).resolve()}")
    try:
        server.run()
    finally:
        stack.stop()


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="API port for the demo (0: any free port)")] = 0,
    data_dir: Annotated[Path | None, typer.Option(help="Where embedded PostgreSQL keeps its data")] = None,
) -> None:
    """Start the embedded stack, run the example workflows end to end and print their timelines."""
    import os

    from stevora.demo import run_demo
    from stevora.devstack import DevStack

    settings = _settings(
        data_dir=str(data_dir) if data_dir else None,
        tool_modules=["examples.tools"],
        log_level=os.environ.get("STEVORA_LOG_LEVEL", "WARNING"),
    )
    if port == 0:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    stack = DevStack(settings, port=port)
    try:
        stack.start_backend()
        stack.start_api_in_thread()
        ok = run_demo(
            stack.url,
            stack.api_key,
            Path(settings.data_dir) / "dev-api-key",
            offline=not (settings.openai_api_key or settings.anthropic_api_key),
        )
    finally:
        stack.stop()
    raise typer.Exit(0 if ok else 1)
