"""The provider seam: a provider's settings, keys and env names live in its own module, every
registered provider is wired into `Settings`, and every secret it declares is redacted from logs."""

from __future__ import annotations

import re
from pathlib import Path

import structlog

from stevora.llm.providers import REGISTERED, ProviderSettings, key_variables, keyless, offline_when_keyless
from stevora.llm.providers.base import CallSettings
from stevora.logging import REDACTED, redactor, secrets_of
from stevora.secrets import is_secret
from stevora.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
# Where a provider's names may appear: its declaration, its adapter, the fake vendor servers.
PROVIDER_HOMES = ("stevora/llm/providers/", "stevora/testing/")
ADAPTER = re.compile(r"stevora/llm/\w+_provider\.py$")
KEY_LIKE = re.compile(r"(_key|_keys|_token|_secret)$")


def _provider_names() -> dict[str, str]:
    """Each provider setting's field name and env names, with the provider that declares it."""
    names: dict[str, str] = {}
    for spec in REGISTERED:
        for field_name, field in spec.settings.model_fields.items():
            names[field_name] = spec.name
            names[f"STEVORA_{field_name.upper()}"] = spec.name
            alias = field.validation_alias
            for choice in getattr(alias, "choices", ()):
                names[str(choice)] = spec.name
    return names


def test_every_registered_provider_is_part_of_settings_and_every_provider_base_is_registered() -> None:
    bases = [b for b in ProviderSettings.__bases__ if b is not CallSettings]
    assert bases == [spec.settings for spec in REGISTERED]
    assert issubclass(Settings, ProviderSettings)
    for spec in REGISTERED:
        for field_name in spec.settings.model_fields:
            assert field_name in Settings.model_fields, (spec.name, field_name)
    assert len({spec.name for spec in REGISTERED}) == len(REGISTERED)


def test_no_provider_setting_or_env_name_is_spelled_outside_its_provider_module() -> None:
    names = _provider_names()
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    found: list[str] = []
    for path in sorted([*ROOT.joinpath("stevora").rglob("*.py"), *ROOT.joinpath("workers").rglob("*.py")]):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(PROVIDER_HOMES) or ADAPTER.search(relative):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in pattern.finditer(line):
                found.append(f"{relative}:{number}: {match.group(1)} ({names[match.group(1)]})")
    assert not found, "provider names outside stevora/llm/providers/:\n" + "\n".join(found)


def test_every_key_like_provider_setting_is_typed_as_a_secret() -> None:
    for spec in REGISTERED:
        for field_name in spec.settings.model_fields:
            if KEY_LIKE.search(field_name):
                assert is_secret(spec.settings, field_name), f"{spec.name}.{field_name} is not a SecretKey"
    assert is_secret(Settings, "admin_token") and is_secret(Settings, "metrics_token")


def test_every_secret_a_provider_declares_is_redacted_from_log_events() -> None:
    values: dict[str, object] = {}
    expected: list[str] = []
    for spec in REGISTERED:
        for field_name in spec.settings.model_fields:
            if not is_secret(spec.settings, field_name):
                continue
            secret = f"sk-{spec.name}-{field_name}-0123456789abcdef"
            expected.append(secret)
            by_name = isinstance(spec.settings.model_fields[field_name].get_default(), dict)
            values[field_name] = {"server": secret} if by_name else secret
    assert len(expected) >= 3  # two hosted keys and the compatible servers' keys, at least
    settings = Settings(**values)
    redact = redactor(secrets_of(settings))
    for secret in expected:
        event = redact(None, "info", {"event": "call_failed", "error": f"401 for key {secret}!"})
        assert event["error"] == f"401 for key {REDACTED}!", secret
        assert secret not in str(event)


def test_configured_logging_redacts_each_provider_key() -> None:
    secrets = {spec.key_variable(): f"{spec.name}-key-0123456789" for spec in REGISTERED if spec.key}
    assert set(secrets) == set(key_variables()) and len(secrets) >= 2
    settings = Settings(**{spec.key: f"{spec.name}-key-0123456789" for spec in REGISTERED if spec.key})
    with structlog.testing.capture_logs(processors=[redactor(secrets_of(settings))]) as logs:
        for value in secrets.values():
            structlog.get_logger().warning("leak", detail=value)
    assert [entry["detail"] for entry in logs] == [REDACTED] * len(secrets)


def test_offline_when_no_hosted_key_is_set_and_compat_servers_do_not_count() -> None:
    compat_only = Settings(compat_base_urls={"local": "http://127.0.0.1:9/v1"})
    assert keyless(compat_only)
    assert offline_when_keyless(compat_only).scripted_fallback is True
    for spec in REGISTERED:
        if spec.key is not None:
            keyed = Settings(**{spec.key: "k" * 20})
            assert not keyless(keyed)
            assert offline_when_keyless(keyed) is keyed
