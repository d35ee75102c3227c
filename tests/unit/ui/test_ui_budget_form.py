"""The run page's Change budget form, parsed into a `Budget` (no I/O)."""

from __future__ import annotations

import pytest

from stevora.errors import ValidationError
from stevora.ui.actions import _budget_form


def test_the_ui_budget_form_keeps_empty_fields_and_names_a_bad_one() -> None:
    parsed = _budget_form({"maxCostCents": "12.5", "maxModelCalls": "", "maxToolCalls": " 7 "})
    assert parsed.model_fields_set == {"max_cost_cents", "max_tool_calls"}
    assert (parsed.max_cost_cents, parsed.max_tool_calls) == (12.5, 7)
    with pytest.raises(ValidationError) as caught:
        _budget_form({"maxToolCalls": "2.5", "maxModelCalls": "-1"})
    assert [p["path"] for p in caught.value.details["errors"]] == ["maxToolCalls"]
    with pytest.raises(ValidationError) as negative:
        _budget_form({"maxModelCalls": "-1"})
    assert negative.value.details["errors"][0]["path"] == "maxModelCalls"
