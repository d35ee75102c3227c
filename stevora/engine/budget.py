"""Run budgets: what a run may use (resolved once, at create), what it has used (`Meter`), what a
step does when a limit is reached, and raising the limits (`update_budget`).

Checked before each model call and each tool call; the usage is read once when a step starts or
resumes (`stevora.db.budgets`: derived from committed rows, so a crash or a retry re-reads it) and
kept up to date in memory from what the step itself commits. A run with no budget reads nothing
and checks nothing. The rules (what counts, the call that crosses the cost line): see
docs/definitions.md#budgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import budgets as db_budgets
from stevora.db import runs
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.definitions import Budget
from stevora.engine.hints import dispatch_hint
from stevora.errors import InvalidStateTransition, NotFoundError, ValidationError
from stevora.events import Event, EventType
from stevora.observability.metrics import BUDGET_STOPS
from stevora.settings import Settings
from stevora.statuses import PauseReason, ResumeReason, RunStatus, StepStatus
from stevora.tasks import StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.engine")

# The `signal_type` of a step waiting for its run's budget to be raised (PauseReason.BUDGET).
BUDGET_SIGNAL = "budget"
BUDGET_EXCEEDED = "BUDGET_EXCEEDED"

# wire name → (Budget attribute, Settings ceiling, metrics label)
_LIMITS: dict[str, tuple[str, str, str]] = {
    "maxCostCents": ("max_cost_cents", "max_run_cost_cents", "cost"),
    "maxModelCalls": ("max_model_calls", "max_run_model_calls", "model_calls"),
    "maxToolCalls": ("max_tool_calls", "max_run_tool_calls", "tool_calls"),
}


def resolve(
    settings: Settings, default: Budget | None, requested: Budget | None = None, *, path: str = "budget"
) -> dict[str, Any] | None:
    """The budget to store on a run: `default` (the definition's, or the run's current one),
    overridden by the fields `requested` sets (null removes a limit), within the server's ceiling.

    A requested limit above the ceiling is a VALIDATION_ERROR naming `<path>.<field>`; a default
    above it is lowered to it; a limit left unset gets the ceiling. None: no limit at all.
    """
    out: dict[str, Any] = {"onBudgetExceeded": default.on_budget_exceeded if default else "fail"}
    given = requested.model_fields_set if requested is not None else set()
    if requested is not None and "on_budget_exceeded" in given:
        out["onBudgetExceeded"] = requested.on_budget_exceeded
    problems: list[dict[str, str]] = []
    for wire, (attr, ceiling_attr, _) in _LIMITS.items():
        from_request = requested is not None and attr in given
        value = getattr(requested if from_request else default, attr, None)
        ceiling = getattr(settings, ceiling_attr)
        if ceiling is not None:
            if value is None:
                value = ceiling
            elif value > ceiling:
                if from_request:
                    problems.append(
                        {
                            "path": f"{path}.{wire}" if path else wire,
                            "message": f"{value:g} is above this server's maximum of {ceiling:g} "
                            f"(STEVORA_{ceiling_attr.upper()})",
                        }
                    )
                value = ceiling
        if value is not None:
            out[wire] = value
    if problems:
        raise ValidationError.from_problems(problems)
    return out if len(out) > 1 else None


@dataclass(slots=True)
class Meter:
    """A run's limits and what it has used, held by a step while it runs."""

    run_id: str
    budget: dict[str, Any]
    cost_cents: float
    model_calls: int
    tool_calls: int
    max_cost_cents: float | None
    max_model_calls: int | None
    max_tool_calls: int | None

    @classmethod
    async def read(cls, pool: asyncpg.Pool, run_id: str) -> Meter | None:
        """The run's budget and usage as committed (one statement); None when it has no budget."""
        row = await db_budgets.usage(pool, run_id)
        if row is None or row["budget"] is None:
            return None
        budget = dict(row["budget"])
        return cls(
            run_id=run_id,
            budget=budget,
            cost_cents=float(row["total_cost_cents"] or 0.0),
            model_calls=int(row["model_calls"]),
            tool_calls=int(row["tool_calls"]),
            max_cost_cents=budget.get("maxCostCents"),
            max_model_calls=budget.get("maxModelCalls"),
            max_tool_calls=budget.get("maxToolCalls"),
        )

    @property
    def pauses(self) -> bool:
        return bool(self.budget.get("onBudgetExceeded") == "pause")

    def model_call_refused(self) -> str | None:
        """The limit that refuses the next model call, or None. The spend is checked as it stands:
        the call that crosses `maxCostCents` finishes (its cost is unknown until it answers)."""
        if self.max_model_calls is not None and self.model_calls >= self.max_model_calls:
            return "maxModelCalls"
        if self.max_cost_cents is not None and self.cost_cents >= self.max_cost_cents:
            return "maxCostCents"
        return None

    def tool_calls_left(self) -> int | None:
        """How many more tool calls the budget allows; None: no limit."""
        if self.max_tool_calls is None:
            return None
        return max(0, self.max_tool_calls - self.tool_calls)

    def still_refused(self, limit: str) -> bool:
        if limit == "maxToolCalls":
            return self.tool_calls_left() == 0
        return self.model_call_refused() is not None

    def used(self) -> dict[str, Any]:
        return {
            "costCents": round(self.cost_cents, 6),
            "modelCalls": self.model_calls,
            "toolCalls": self.tool_calls,
        }


_USED_KEY = {"maxCostCents": "costCents", "maxModelCalls": "modelCalls", "maxToolCalls": "toolCalls"}


def stopped(meter: Meter, limit: str, step_name: str) -> StepResult:
    """What a step returns when `limit` refuses its next call: a failure (BUDGET_EXCEEDED, not
    retried) or, with `onBudgetExceeded: "pause"`, a wait for a person to raise the budget."""
    action = "pause" if meter.pauses else "fail"
    BUDGET_STOPS.labels(_LIMITS[limit][2], action).inc()
    used = meter.used()
    details = {"limit": limit, "max": meter.budget.get(limit), "used": used, "budget": meter.budget}
    log.info(
        "budget_exceeded",
        workflow_run_id=meter.run_id,
        step_name=step_name,
        limit=limit,
        action=action,
        used=used[_USED_KEY[limit]],
    )
    if meter.pauses:
        return StepResult(
            status="waiting",
            signal_type=BUDGET_SIGNAL,
            pause_reason=PauseReason.BUDGET,
            pause_details={"budgetLimit": limit, "budget": meter.budget, "used": used},
        )
    return StepResult(
        status="failed",
        retryable=False,
        error={
            "code": BUDGET_EXCEEDED,
            "message": f"The run reached its budget: {limit} {meter.budget.get(limit):g} "
            f"(used {used[_USED_KEY[limit]]:g})",
            "details": details,
        },
    )


async def update_budget(rt: Runtime, workspace_id: str, run_id: str, requested: Budget) -> tuple[DbRow, bool]:
    """Set the fields `requested` gives on a run's budget (null removes a limit), within the
    server's ceiling; a run waiting for its budget (`onBudgetExceeded: "pause"`) resumes.

    Allowed on any run that has not completed or been cancelled: a FAILED run keeps the new budget
    for `retry`. A running step sees new limits when it next starts or resumes, or when it reaches
    an old limit (it reads them again before it stops). A raise that commits after that read and
    before the step's WAITING commit is caught by `raised_since_stop`, in the WAITING transaction.
    Returns the run and whether it resumed."""
    resumed = False
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await runs.get_run_in_workspace(conn, workspace_id, run_id, for_update=True)
        if run is None:
            raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
        if run["status"] in (RunStatus.COMPLETED, RunStatus.CANCELLED):
            raise InvalidStateTransition(
                f"The budget of a {run['status']} run cannot change",
                details={"workflowRunId": run_id, "status": run["status"]},
            )
        current = Budget.model_validate(run["budget"]) if run["budget"] is not None else None
        budget = resolve(rt.settings, current, requested, path="")
        events = [Event(EventType.BUDGET_UPDATED, {"budget": budget, "previous": run["budget"]})]
        sets: dict[str, Any] = {"budget": budget}
        step_run = (
            await runs.get_step_run(conn, run["current_step_run_id"]) if run["current_step_run_id"] else None
        )
        if (
            run["status"] == RunStatus.WAITING
            and step_run is not None
            and step_run["status"] == StepStatus.WAITING
            and step_run["signal_type"] == BUDGET_SIGNAL
        ):
            events.append(await _resume_step(conn, step_run))
            sets.update(_RESUMED_RUN)
            resumed = True
        row = await runs.update_run(
            conn,
            run_id,
            expect=[run["status"]],
            sets=sets,
            now_columns=["dispatched_at"] if resumed else [],
            events=events,
        )
    if resumed:
        await dispatch_hint(rt.dispatcher, run_id)
    return row, resumed


# What a run resumed from its budget wait is set to (dispatched again, owned by nobody).
_RESUMED_RUN: dict[str, Any] = {"status": RunStatus.RUNNING, "next_run_at": None, **RELEASE}


async def _resume_step(conn: asyncpg.Connection, step_run: DbRow) -> Event:
    """The step's budget wait ends (WAITING → RUNNING); returns the run's WORKFLOW_RESUMED event."""
    await runs.update_step(
        conn,
        step_run["id"],
        expect=[StepStatus.WAITING],
        sets={"status": StepStatus.RUNNING, "wait_until": None, "signal_type": None},
    )
    return Event(
        EventType.WORKFLOW_RESUMED,
        {"reason": ResumeReason.BUDGET, "stepName": step_run["step_name"]},
        step_run["id"],
    )


async def raised_since_stop(conn: asyncpg.Connection, run_id: str, result: StepResult) -> bool:
    """Called first in the transaction that makes a step wait for its budget: locks the run (so
    a raise commits either before, and is seen here, or after, and finds the run WAITING) and
    says whether its budget changed since the step read the one that stopped it."""
    stopped_by = (result.pause_details or {}).get("budget")
    return await db_budgets.locked_budget(conn, run_id) != stopped_by


async def resume_raised(conn: asyncpg.Connection, run_id: str, step_run: DbRow) -> None:
    """A budget wait written after a raise had committed ends at once, as the raise would have
    ended it had it come after: the step runs again under the new limits."""
    resumed = await _resume_step(conn, step_run)
    await runs.update_run(
        conn,
        run_id,
        expect=[RunStatus.WAITING],
        sets=_RESUMED_RUN,
        now_columns=["dispatched_at"],
        events=[resumed],
    )
