from __future__ import annotations

from pathlib import Path

from stevora.settings import Settings

DOC = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()


def test_every_setting_is_documented_in_the_configuration_table() -> None:
    for name, field in Settings.model_fields.items():
        env = (
            " / ".join(field.validation_alias.choices)
            if field.validation_alias
            else f"STEVORA_{name.upper()}"
        )
        assert f"`{env}`" in DOC, f"{env} is missing from docs/configuration.md"
