"""docker-compose.yml is checked against the Compose specification schema (no Docker engine here)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from jsonschema import Draft7Validator

ROOT = Path(__file__).resolve().parents[3]


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    schema = json.loads((ROOT / "tests" / "data" / "compose_spec.json").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    errors = sorted(Draft7Validator(schema).iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors]


def test_compose_runs_every_process_from_the_dockerfile_image() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "rabbitmq", "redis", "migrate", "api", "worker"} <= set(services)
    for name in ("migrate", "api", "worker"):
        assert services[name]["build"] == "."
        assert services[name]["command"][0] == "stevora"
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    dockerfile = (ROOT / "Dockerfile").read_text()
    for path in ("stevora", "workers", "migrations", "examples"):
        assert f"COPY {path}" in dockerfile or f" {path} " in dockerfile


def test_the_image_installs_the_built_wheel_not_the_source_tree() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip wheel --no-deps" in dockerfile
    assert 'pip install "$(ls /dist/*.whl)[server]"' in dockerfile  # the wheel, with the server extra
    assert "pip install -e" not in dockerfile
    # The final stage starts from a clean base: the source tree is only in the build stage.
    final_stage = dockerfile.rsplit("FROM ", 1)[1]
    assert "COPY stevora" not in final_stage and "COPY --from=build /dist" in final_stage
