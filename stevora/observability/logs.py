"""Standard-library logs (uvicorn, dramatiq, pika, httpx, alembic...) rendered by structlog.

One format for every line of a process: the libraries' records go through the same processors and
renderer as Stevora's own (JSON in production), with the bound context (`workflow_run_id`, `step`,
`round`) merged in. Libraries log at WARNING and above; uvicorn's access log is on only when
`STEVORA_ACCESS_LOG=true`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import structlog

_HANDLER_NAME = "stevora-structlog"


def _drop_color_message(
    _logger: object, _name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    # uvicorn adds an ANSI-coloured copy of its message as an `extra`; the plain one is enough.
    event.pop("color_message", None)
    return event


def route_stdlib_logging(
    level: int,
    renderer: structlog.types.Processor,
    *,
    access_log: bool,
    processors: Sequence[structlog.types.Processor] = (),
) -> None:
    """Send the root logger's records through structlog; `processors` run before `renderer`
    (traceback formatting, secret redaction)."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(),
            _drop_color_message,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *processors, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    # Called again (tests, a worker process started from the CLI): replace, never stack, handlers.
    root.handlers = [h for h in root.handlers if h.get_name() != _HANDLER_NAME] + [handler]
    root.setLevel(max(level, logging.WARNING))
    # uvicorn installs no handlers of its own when started with log_config=None: its records
    # propagate to the root handler above (undo what an earlier uvicorn config in this process did).
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True
    access = logging.getLogger("uvicorn.access")
    access.setLevel(logging.INFO if access_log else logging.WARNING)
    access.disabled = not access_log


def redact_url(url: str) -> str:
    """A broker or database URL without its credentials, for startup lines."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}" if sep else url
