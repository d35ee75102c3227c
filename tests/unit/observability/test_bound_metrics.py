"""Children bound for the hot path (`metrics.BoundCounter` / `BoundHistogram`) record exactly
what prometheus-client's own `inc` / `observe` record: if a release of the library changes its
children's insides, this fails instead of the metrics going wrong quietly."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from stevora.observability import metrics

_AMOUNTS = [0.0, 0.004, 0.005, 0.0051, 0.3, 1, 2.5, 59.9, 60, 61, 1e9, math.inf, math.nan]


def _samples(registry: CollectorRegistry) -> list[bytes]:
    """The exposition without its `_created` timestamps (two registries differ in those only)."""
    return [line for line in generate_latest(registry).splitlines() if b"_created" not in line]


def _pair(kind: type, **kw: object) -> tuple[CollectorRegistry, object, CollectorRegistry, object]:
    a, b = CollectorRegistry(), CollectorRegistry()
    return a, kind(registry=a, **kw), b, kind(registry=b, **kw)


def test_a_bound_histogram_records_what_observe_records() -> None:
    kw = {"name": "h", "documentation": "d", "labelnames": ["x"], "buckets": metrics._FAST}
    own_registry, own, bound_registry, bound = _pair(Histogram, **kw)
    child = metrics.bound_histogram(bound, "v")  # type: ignore[arg-type]
    for amount in _AMOUNTS:
        own.labels("v").observe(amount)  # type: ignore[attr-defined]
        child.observe(amount)
    assert _samples(bound_registry) == _samples(own_registry)


def test_a_bound_counter_records_what_inc_records() -> None:
    kw = {"name": "c", "documentation": "d", "labelnames": ["x", "y"]}
    own_registry, own, bound_registry, bound = _pair(Counter, **kw)
    child = metrics.bound_counter(bound, "v", "w")  # type: ignore[arg-type]
    for amount in [0, 1, 7, 0.25]:
        own.labels("v", "w").inc(amount)  # type: ignore[attr-defined]
        child.inc(amount)
    assert _samples(bound_registry) == _samples(own_registry)
    with pytest.raises(ValueError, match="non-negative"):
        child.inc(-1)
