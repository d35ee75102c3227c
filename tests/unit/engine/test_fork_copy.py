"""What a fork copies is decided before its transaction, from the plan's history alone
(`fork.plan_copy`: no connection, nothing written); `_write_fork` only writes it."""

from __future__ import annotations

from typing import Any

from stevora.engine.fork import ForkPlan, ForkPoint, plan_copy


def _call(id_: str, step_run_id: str, round_: int, cost: float) -> dict[str, Any]:
    return {
        "id": id_,
        "step_run_id": step_run_id,
        "round": round_,
        "cost_usd": cost,
        "input_tokens": 10 * round_,
        "output_tokens": round_,
        "request": {"messages": [{"role": "system", "content": "old"}, {"role": "user", "content": "hi"}]},
    }


def _trace(id_: str, step_run_id: str, llm_call_id: str, round_: int, tool_call_id: str) -> dict[str, Any]:
    return {
        "id": id_,
        "step_run_id": step_run_id,
        "llm_call_id": llm_call_id,
        "round": round_,
        "tool_call_id": tool_call_id,
        "output_json": None,
        "status": "failed",
        "error": "boom",
        "error_code": "TOOL_ERROR",
        "result_text": '{"error": "boom"}',
    }


def test_a_fork_at_a_round_copies_the_steps_before_it_and_the_rounds_before_the_point() -> None:
    steps = [
        {"id": "sr_prep", "step_name": "prep", "visit": 1, "step_index": 0, "step_type": "llm"},
        {"id": "sr_agent", "step_name": "agent", "visit": 1, "step_index": 1, "step_type": "llm"},
    ]
    calls = [
        _call("c_prep", "sr_prep", 1, 0.01),
        _call("c1", "sr_agent", 1, 0.02),
        _call("c2", "sr_agent", 2, 0.5),
    ]
    traces = [
        _trace("t_prep", "sr_prep", "c_prep", 1, "tc_prep"),
        _trace("t1a", "sr_agent", "c1", 1, "tc_a"),
        _trace("t1b", "sr_agent", "c1", 1, "tc_b"),
        _trace("t2", "sr_agent", "c2", 2, "tc_c"),
    ]
    prep = ForkPoint("prep", 1, 0, "llm", None, {}, ["sr_prep"])
    agent = ForkPoint("agent", 1, 1, "llm", None, {}, ["sr_agent"])
    point = ForkPoint("agent", 1, 1, "llm", 2, {"k": 1}, ["sr_agent"], llm_call_id="c2")
    plan = ForkPlan(
        origin={"id": "run", "input": {}},  # type: ignore[arg-type]
        point=point,
        points=[prep, ForkPoint("prep", 1, 0, "llm", 1, {}, ["sr_prep"]), agent, point],
        history={"steps": steps, "calls": calls, "traces": traces},  # type: ignore[dict-item]
        state_edits={},
        tool_results={"tc_b": {"fixed": True}},
        model=None,
        system_prompt="You are {{state.k}}",
    )

    copying = plan_copy(plan)

    assert [s["id"] for s in copying.inherited_steps] == ["sr_prep"] and copying.inherited_visits == 1
    assert (copying.own_step["id"], copying.own_status, copying.own_step_run_ids) == (
        "sr_agent",
        "RUNNING",
        ("sr_agent",),
    )
    assert [c["inherited_from"] for c in copying.calls] == ["c_prep", "c1"]  # not round 2
    assert len({c["id"] for c in copying.calls} | {"c_prep", "c1"}) == 4  # new ids
    # The first round's request gets the edited system prompt, rendered with the point's state.
    assert copying.calls[1]["request"]["messages"][0] == {"role": "system", "content": "You are 1"}
    assert copying.calls[0]["request"]["messages"][0]["content"] == "old"
    by_origin = {t["inherited_from"]: t for t in copying.traces}
    assert set(by_origin) == {"t_prep", "t1a", "t1b"}
    assert by_origin["t1b"]["status"] == "completed" and by_origin["t1b"]["output_json"] == {"fixed": True}
    assert by_origin["t1a"]["status"] == "failed"
    new_call_of = {c["inherited_from"]: c["id"] for c in copying.calls}
    assert by_origin["t1a"]["llm_call_id"] == new_call_of["c1"]
    cents, tokens_in, tokens_out = copying.totals
    assert round(cents, 6) == 3.0 and (tokens_in, tokens_out) == (20, 2)
    assert copying.start_step == "agent"
