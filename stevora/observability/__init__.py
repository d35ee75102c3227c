"""Observability: OpenTelemetry spans (tracing.py), Prometheus metrics (metrics.py), and the engine's
observation points that bind both and the structlog context (hooks.py). See docs/observability.md."""
