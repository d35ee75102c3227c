"""Metric labels are bounded: no model or tool name a tenant (or a model) chose reaches `/metrics`."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from stevora.observability import hooks, metrics
from stevora.tools import ToolOutcome


def _tool_labels() -> set[str]:
    body, _ = metrics.exposition()
    return {
        sample.labels["tool"]
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name.startswith("stevora_tool_call")
    }


def _outcome(code: str | None) -> ToolOutcome:
    status = "failed" if code else "completed"
    return ToolOutcome(status, {}, None, code, code, 1.0, "{}")  # type: ignore[arg-type]


def test_a_call_of_a_name_no_handler_has_is_counted_as_other() -> None:
    for name, code in (
        ("zz_unregistered_name_1", "TOOL_NOT_REGISTERED"),
        ("zz_not_offered_1", "TOOL_NOT_OFFERED"),
    ):
        with hooks.tool_call(name, "call_1", "sr_1", 1, {}) as obs:
            obs.finished(_outcome(code))
    with hooks.tool_call("zz_registered_handler", "call_2", "sr_1", 1, {}) as obs:
        obs.finished(_outcome("TOOL_ERROR"))
    labels = _tool_labels()
    assert "zz_unregistered_name_1" not in labels and "zz_not_offered_1" not in labels
    assert {"other", "zz_registered_handler"} <= labels


def test_a_model_call_is_labelled_with_its_price_list_name_or_other() -> None:
    with hooks.model_call("openai", "gpt-4o-zz-tenant-secret", "sr_1", 1, []) as obs:
        assert obs.model == "other"
    with hooks.model_call(
        "anthropic", "claude-3-5-sonnet-zz", "sr_1", 1, [], known_model="claude-3-5-sonnet"
    ) as obs:
        assert obs.model == "claude-3-5-sonnet"
    body, _ = metrics.exposition()
    assert b"zz-tenant-secret" not in body and b"claude-3-5-sonnet-zz" not in body


def test_the_metrics_token_is_checked_as_a_bearer_token() -> None:
    assert metrics.authorized(None, None) and metrics.authorized("", "anything")
    assert metrics.authorized("t0ken", "Bearer t0ken") and metrics.authorized("t0ken", "bearer  t0ken")
    for given in (None, "", "Bearer", "Bearer t0ke", "Bearer t0ken2", "Basic t0ken", "t0ken"):
        assert not metrics.authorized("t0ken", given), given
