"""docs/grafana-dashboard.json is valid JSON and every query names metrics Stevora exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import stevora.observability.metrics  # noqa: F401  (declares the metrics)

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana-dashboard.json"
DOC = DASHBOARD.with_name("observability.md")


def _families() -> dict[str, str]:
    """Stevora's metric names as users see them (`..._total` for counters) and their types."""
    found: dict[str, str] = {}
    for family in REGISTRY.collect():
        if family.name.startswith("stevora_"):
            found[family.name + ("_total" if family.type == "counter" else "")] = family.type
    return found


def _exported_series() -> set[str]:
    names: set[str] = set()
    for name, kind in _families().items():
        names.add(name)
        if kind == "histogram":
            names.update(name + suffix for suffix in ("_bucket", "_count", "_sum"))
    return names


def _queries(text: str) -> list[str]:
    return re.findall(r"stevora_[a-z_]+", text)


def test_every_dashboard_query_uses_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    exported = _exported_series()
    for expr in exprs:
        used = _queries(expr)
        assert used, f"query names no Stevora metric: {expr}"
        for name in used:
            assert name in exported, f"{name} (in {expr!r}) is not a metric Stevora exports"


def test_every_metric_is_on_the_dashboard_and_in_the_docs() -> None:
    text = DASHBOARD.read_text()
    doc = DOC.read_text()
    families = _families()
    assert len(families) >= 13
    for name in families:
        base = name.removesuffix("_total")
        assert base in text, f"{name} has no panel on the dashboard"
        assert f"`{name}`" in doc, f"{name} is not documented in docs/observability.md"
