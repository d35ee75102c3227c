"""Library log records (pika, dramatiq, uvicorn) come out as JSON lines when the format is JSON.

Each case runs in a fresh interpreter, since logging configuration is process-global."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PRELUDE = """
from stevora.logging import configure_logging
from stevora.settings import Settings
configure_logging(Settings(log_format="json"))
"""


def _stderr_records(script: str) -> list[dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, proc
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n--- stderr ---\n{proc.stderr}") from None
    return records


def test_pika_connection_failure_is_logged_as_json_lines() -> None:
    records = _stderr_records(
        """
        import pika
        params = pika.ConnectionParameters("127.0.0.1", 1, connection_attempts=1, socket_timeout=2)
        try:
            pika.BlockingConnection(params)
        except Exception:
            pass
        """
    )
    assert any(str(r.get("logger", "")).startswith("pika") for r in records), records
    assert all(r["level"] in ("warning", "error", "critical") for r in records)


def test_dramatiq_traceback_is_one_json_record_with_the_exception() -> None:
    records = _stderr_records(
        """
        import dramatiq
        from dramatiq.brokers.stub import StubBroker
        broker = StubBroker()
        broker.emit_after("process_boot")

        @dramatiq.actor(broker=broker, max_retries=0)
        def explode():
            raise RuntimeError("actor on fire")

        worker = dramatiq.Worker(broker, worker_timeout=100)
        worker.start()
        explode.send()
        broker.join(explode.queue_name, fail_fast=False)
        worker.join()
        worker.stop()
        """
    )
    failed = [r for r in records if "actor on fire" in str(r.get("exception", ""))]
    assert failed, records
    assert str(failed[0]["logger"]).startswith("dramatiq")
    assert "Traceback" in str(failed[0]["exception"])


def test_uvicorn_startup_traceback_is_a_json_record() -> None:
    records = _stderr_records(
        """
        import contextlib, uvicorn
        from stevora.logging import uvicorn_log_settings

        @contextlib.asynccontextmanager
        async def lifespan(app):
            raise RuntimeError("database unreachable at boot")
            yield

        from fastapi import FastAPI
        config = uvicorn.Config(FastAPI(lifespan=lifespan), host="127.0.0.1", port=0, **uvicorn_log_settings())
        uvicorn.Server(config).run()
        """
    )
    # uvicorn logs the formatted traceback as the message itself.
    failed = [
        r for r in records if "database unreachable at boot" in f"{r['event']} {r.get('exception', '')}"
    ]
    assert failed, records
    assert str(failed[0]["logger"]).startswith("uvicorn")


def test_configured_secrets_are_redacted_from_every_log_line() -> None:
    key = "sk-test-redact-me-0123456789abcdef"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import logging, structlog
                from stevora.logging import configure_logging
                from stevora.settings import Settings
                configure_logging(Settings(log_format="json", openai_api_key="{key}"))
                structlog.get_logger("t").warning("provider_said", error="Incorrect API key provided: {key}")
                logging.getLogger("httpx").warning("Authorization: Bearer {key}")
                try:
                    raise RuntimeError("key {key} rejected")
                except RuntimeError:
                    structlog.get_logger("t").exception("call_failed")
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 3, proc.stderr
    assert key not in proc.stderr
    assert "[REDACTED]" in lines[0]["error"] and "[REDACTED]" in lines[1]["event"]
    assert "[REDACTED]" in lines[2]["exception"]
