"""structlog setup: JSON lines in production, readable console output in a terminal.

Libraries log through the standard `logging` module (pika, dramatiq, uvicorn, asyncpg); their
records go through the same structlog processors and renderer via a root handler, so a JSON log
stays one JSON object per line, tracebacks included (`exception`)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from stevora.observability.logs import route_stdlib_logging
from stevora.secrets import secret_values
from stevora.settings import Settings

# uvicorn's loggers: with `log_config=None` uvicorn leaves them to us, and they propagate to root.


REDACTED = "[REDACTED]"


def secrets_of(settings: Settings) -> tuple[str, ...]:
    """Every setting typed as a secret (stevora/secrets.py): provider keys, the admin token."""
    # Short values would redact ordinary words; real keys are long.
    values = secret_values(settings)
    return tuple(sorted({v for v in values if v and len(v) >= 8}, key=len, reverse=True))


def redactor(secrets: tuple[str, ...]) -> structlog.types.Processor:
    """Replace configured secrets (provider keys, the admin token) wherever they appear in an event's
    string values, for records from any library too: a last line of defence, not a licence to log."""

    def redact(
        _logger: object, _method: str, event_dict: structlog.types.EventDict
    ) -> structlog.types.EventDict:
        for key, value in event_dict.items():
            if isinstance(value, str) and any(secret in value for secret in secrets):
                for secret in secrets:
                    value = value.replace(secret, REDACTED)
                event_dict[key] = value
        return event_dict

    return redact


def renders_json(settings: Settings) -> bool:
    return settings.log_format == "json" or (settings.log_format == "auto" and not sys.stderr.isatty())


def configure_logging(settings: Settings) -> None:
    level = getattr(logging, settings.log_level.upper(), logging.INFO)
    as_json = renders_json(settings)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    exceptions: structlog.types.Processor = (
        structlog.processors.format_exc_info if as_json else structlog.processors.StackInfoRenderer()
    )
    secrets = secrets_of(settings)
    if secrets:  # after the traceback is rendered to text, so it is covered too
        exceptions_then_redact: list[structlog.types.Processor] = [exceptions, redactor(secrets)]
    else:
        exceptions_then_redact = [exceptions]
    structlog.configure(
        processors=[*shared, *exceptions_then_redact, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write per line (PrintLogger writes the line and its newline separately): worker
        # processes sharing one stderr then never interleave halves of their JSON lines.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries' records (uvicorn, pika, dramatiq...) through the same processors, redaction included.
    route_stdlib_logging(level, renderer, access_log=settings.access_log, processors=exceptions_then_redact)


def uvicorn_log_settings(*, access_log: bool = False) -> dict[str, Any]:
    """`uvicorn.Config` keyword arguments that leave uvicorn's records to `configure_logging`."""
    return {"log_config": None, "log_level": "info" if access_log else "warning", "access_log": access_log}
