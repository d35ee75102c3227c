"""Logs: library records and Stevora's lines in one JSON format, carrying the bound run context."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from stevora.logging import configure_logging
from stevora.observability import hooks
from stevora.observability.logs import redact_url
from stevora.settings import Settings


@pytest.fixture
def json_logs() -> Iterator[None]:
    yield
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if h.get_name() != "stevora-structlog"]
    logging.getLogger("uvicorn.access").disabled = False
    structlog.reset_defaults()


def _lines(err: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def test_engine_and_library_lines_are_json_with_run_step_and_round(
    json_logs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging(Settings(log_format="json", log_level="INFO"))
    with (
        hooks.run_execution({"id": "wfrun_1", "workspace_id": "ws_1"}, "wf", "worker-1"),
        hooks.step("wfrun_1", "srun_1", "agent", "llm", 1),
        hooks.model_call("unit-test", "m", "srun_1", 3, []),
    ):
        structlog.get_logger("stevora.test").info("model_call_started")
        logging.getLogger("dramatiq.worker").warning("consumer reconnecting")
        logging.getLogger("pika.connection").info("below WARNING: not shown")
    ours, library = _lines(capsys.readouterr().err)
    for line in (ours, library):
        assert (line["workflow_run_id"], line["step"], line["round"]) == ("wfrun_1", "agent", 3)
        assert "timestamp" in line
    assert ours["event"] == "model_call_started" and ours["level"] == "info"
    assert library["event"] == "consumer reconnecting"
    assert (library["logger"], library["level"]) == ("dramatiq.worker", "warning")


def test_the_access_log_is_off_unless_asked_for(json_logs: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(Settings(log_format="json"))
    logging.getLogger("uvicorn.access").info("GET /v1/health 200")
    assert _lines(capsys.readouterr().err) == []
    configure_logging(Settings(log_format="json", access_log=True))
    logging.getLogger("uvicorn.access").info("GET /v1/health 200")
    [line] = _lines(capsys.readouterr().err)
    assert line["event"] == "GET /v1/health 200" and line["logger"] == "uvicorn.access"


def test_startup_lines_show_broker_urls_without_credentials() -> None:
    assert redact_url("amqp://guest:secret@rabbit:5672/") == "amqp://rabbit:5672/"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("stub://dev") == "stub://dev"
