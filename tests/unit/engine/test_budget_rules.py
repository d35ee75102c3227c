"""How a run's budget is resolved (definition default, create override, server ceiling) and how
the meter decides, without I/O."""

from __future__ import annotations

import pytest

from stevora.definitions import Budget
from stevora.engine.budget import Meter, resolve
from stevora.errors import ValidationError
from stevora.settings import Settings


def _budget(**fields: object) -> Budget:
    return Budget.model_validate(fields)


NO_CEILING = Settings(max_run_cost_cents=None, max_run_model_calls=None, max_run_tool_calls=None)
CEILING = Settings(max_run_cost_cents=500, max_run_model_calls=None, max_run_tool_calls=40)


def test_no_budget_anywhere_and_no_ceiling_is_no_budget() -> None:
    assert resolve(NO_CEILING, None) is None
    assert resolve(NO_CEILING, None, _budget(onBudgetExceeded="pause")) is None  # no limit to act on


def test_the_request_overrides_the_definition_field_by_field_and_null_removes_a_limit() -> None:
    default = _budget(maxToolCalls=10, maxModelCalls=5, onBudgetExceeded="pause")
    assert resolve(NO_CEILING, default, _budget(maxToolCalls=3)) == {
        "maxToolCalls": 3,
        "maxModelCalls": 5,
        "onBudgetExceeded": "pause",
    }
    assert resolve(NO_CEILING, default, _budget(maxModelCalls=None, onBudgetExceeded="fail")) == {
        "maxToolCalls": 10,
        "onBudgetExceeded": "fail",
    }


def test_the_ceiling_fills_what_is_unset_and_lowers_a_definition_default_above_it() -> None:
    assert resolve(CEILING, None) == {"maxCostCents": 500, "maxToolCalls": 40, "onBudgetExceeded": "fail"}
    assert resolve(CEILING, _budget(maxToolCalls=100, maxModelCalls=7)) == {
        "maxCostCents": 500,
        "maxModelCalls": 7,
        "maxToolCalls": 40,
        "onBudgetExceeded": "fail",
    }


def test_a_requested_limit_above_the_ceiling_is_an_error_naming_every_such_field() -> None:
    with pytest.raises(ValidationError) as caught:
        resolve(CEILING, None, _budget(maxToolCalls=41, maxCostCents=500.5, maxModelCalls=10**6))
    assert [p["path"] for p in caught.value.details["errors"]] == [
        "budget.maxCostCents",
        "budget.maxToolCalls",
    ]
    with pytest.raises(ValidationError) as raised:
        resolve(CEILING, None, _budget(maxToolCalls=41), path="")
    assert raised.value.details["errors"][0]["path"] == "maxToolCalls"
    # Removing a limit under a ceiling gives the ceiling, not "unlimited".
    assert resolve(CEILING, _budget(maxToolCalls=5), _budget(maxToolCalls=None))["maxToolCalls"] == 40


def _meter(**limits: float) -> Meter:
    budget = {"onBudgetExceeded": "fail", **limits}
    return Meter(
        run_id="wfrun_x",
        budget=budget,
        cost_cents=0.0,
        model_calls=0,
        tool_calls=0,
        max_cost_cents=budget.get("maxCostCents"),
        max_model_calls=budget.get("maxModelCalls"),  # type: ignore[arg-type]
        max_tool_calls=budget.get("maxToolCalls"),  # type: ignore[arg-type]
    )


def test_the_cost_limit_refuses_only_once_the_spend_has_reached_it() -> None:
    meter = _meter(maxCostCents=25)
    for spent in (0.0, 10.0, 24.999):
        meter.cost_cents = spent
        assert meter.model_call_refused() is None
    meter.cost_cents = 25.0
    assert meter.model_call_refused() == "maxCostCents"


def test_model_calls_and_tool_calls_are_counted_against_their_limits() -> None:
    meter = _meter(maxModelCalls=2, maxToolCalls=3)
    meter.model_calls = 1
    assert meter.model_call_refused() is None
    meter.model_calls = 2
    assert meter.model_call_refused() == "maxModelCalls"
    meter.tool_calls = 1
    assert meter.tool_calls_left() == 2 and not meter.still_refused("maxToolCalls")
    meter.tool_calls = 4  # answered from outside while the step waited
    assert meter.tool_calls_left() == 0 and meter.still_refused("maxToolCalls")
    assert _meter().tool_calls_left() is None and _meter().model_call_refused() is None
