"""Hostile input is refused at the edge with a 4xx naming the field, and nothing is stored
(issue 18, "What was found" 2-5; docs/security.md). The limits are set small here so the bodies
stay small; the defaults are checked in tests/unit/test_storable.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from api_helpers import DefinitionFactory, Tenant

from stevora.ids import new_id
from stevora.settings import Settings
from stevora.tools import ToolContext
from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness
from tests.integration.api.test_api_tool_outputs import WEATHER, agent, start, submit, wait_for

LIMITS = {
    "max_request_bytes": 64 * 1024,
    "max_definition_bytes": 16 * 1024,
    "max_run_input_bytes": 8 * 1024,
    "max_signal_payload_bytes": 8 * 1024,
    "max_state_bytes": 16 * 1024,
    "max_list_page_bytes": 10_240,
}


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update=LIMITS)


def raw_run(definition_id: str, input_json: str) -> str:
    """A run-create body with `input` written as given (JSON the encoder would not write)."""
    return '{"definitionId": ' + json.dumps(definition_id) + ', "input": ' + input_json + "}"


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


async def post_raw(client: httpx.AsyncClient, tenant: Tenant, path: str, body: str | bytes) -> httpx.Response:
    headers = {**tenant.headers, "content-type": "application/json"}
    return await client.post(path, content=body, headers=headers)


def problem(response: httpx.Response, status: int, code: str) -> dict[str, str]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    first: dict[str, str] = error["details"]["errors"][0]
    return first


async def run_count(harness: Harness, tenant: Tenant) -> int:
    count: int = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1", tenant.workspace_id
    )
    return count


@pytest.fixture
def seen() -> list[Any]:
    """The run inputs the `ok` task handler was given, as the worker read them."""
    return []


@pytest.fixture
async def task_def(define: DefinitionFactory, harness: Harness, seen: list[Any]) -> str:
    async def ok(ctx: Any) -> dict[str, Any]:
        seen.append(dict(ctx.workflow_input))
        return {"status": "completed"}

    harness.tasks.register("ok", ok)
    return await define([{"type": "task", "name": "t", "handler": "ok"}])


# -- numbers ----------------------------------------------------------------------------------


async def test_a_400_digit_integer_in_run_input_is_a_400_naming_it_and_no_run_is_stored(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness
) -> None:
    body = raw_run(task_def, '{"order": {"amount": ' + "9" * 400 + "}}")
    err = problem(await post_raw(client, tenant, "/v1/workflow-runs", body), 400, "INVALID_NUMBER")
    assert err["path"] == "input.order.amount"
    assert "-2^63 to 2^63-1" in err["message"]
    assert await run_count(harness, tenant) == 0
    listed = await client.get("/v1/workflow-runs", headers=tenant.headers)
    assert listed.status_code == 200 and listed.json()["data"] == []


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
async def test_nan_infinity_and_overflowing_floats_are_refused_not_stored_as_null(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness, literal: str
) -> None:
    body = raw_run(task_def, '{"xs": [1, ' + literal + "]}")
    err = problem(await post_raw(client, tenant, "/v1/workflow-runs", body), 400, "INVALID_NUMBER")
    assert err["path"] == "input.xs[1]"
    assert await run_count(harness, tenant) == 0


async def test_signed_64_bit_integers_reach_the_worker_exactly_and_one_past_is_refused(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness, seen: list[Any]
) -> None:
    edges = {"max": 2**63 - 1, "min": -(2**63), "big_id": 1234567890123456789}
    created = await client.post(
        "/v1/workflow-runs", json={"definitionId": task_def, "input": edges}, headers=tenant.headers
    )
    assert created.status_code == 201, created.text
    await harness.wait_for_status(created.json()["data"]["id"], "COMPLETED")
    assert seen == [edges]  # what the task handler saw: exact ints, not floats
    assert all(type(v) is int for v in seen[0].values())

    for beyond in (2**63, -(2**63) - 1, 2**64):
        body = raw_run(task_def, f'{{"n": {beyond}}}')
        err = problem(await post_raw(client, tenant, "/v1/workflow-runs", body), 400, "INVALID_NUMBER")
        assert err["path"] == "input.n"
    assert await run_count(harness, tenant) == 1


# -- nesting ----------------------------------------------------------------------------------


async def test_run_input_nested_255_deep_is_refused_and_the_run_list_still_answers(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness
) -> None:
    for depth in (255, 5000):
        # Written by hand: json.dumps itself stops short of 5000 levels.
        body = raw_run(task_def, '{"a":' * depth + "1" + "}" * depth)
        err = problem(await post_raw(client, tenant, "/v1/workflow-runs", body), 400, "JSON_TOO_DEEP")
        assert err["path"].startswith("input"), err
        assert "64 levels" in err["message"]
    assert await run_count(harness, tenant) == 0
    assert (await client.get("/v1/workflow-runs", headers=tenant.headers)).status_code == 200
    # At the limit it is stored and read back.
    ok = await client.post(
        "/v1/workflow-runs", json={"definitionId": task_def, "input": nested(63)}, headers=tenant.headers
    )
    assert ok.status_code == 201, ok.text
    assert (await client.get("/v1/workflow-runs", headers=tenant.headers)).status_code == 200


async def test_a_signal_payload_290_deep_is_refused_and_not_merged_into_state(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    run = await start(
        client, tenant, await define([{"type": "external_event", "name": "e", "signalType": "go"}])
    )
    await harness.wait_for_status(run, "WAITING")
    response = await client.post(
        f"/v1/workflow-runs/{run}/resume",
        json={"signalType": "go", "payload": {"deep": nested(290)}},
        headers=tenant.headers,
    )
    err = problem(response, 400, "JSON_TOO_DEEP")
    assert err["path"].startswith("payload.deep.a.a")
    row = await harness.rt.pool.fetchrow("SELECT status, state FROM workflow_runs WHERE id = $1", run)
    assert row["status"] == "WAITING" and row["state"] == {}


async def test_a_client_tool_output_290_deep_is_refused_and_tool_traces_still_answer(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    run_id = await start(client, tenant, await define([agent(WEATHER)]))
    run = await wait_for(client, tenant, run_id, "WAITING")
    call_id = run["requiredAction"]["toolCalls"][0]["id"]
    response = await submit(client, tenant, run_id, {"toolCallId": call_id, "output": nested(290)})
    err = problem(response, 400, "JSON_TOO_DEEP")
    assert err["path"].startswith("toolOutputs[0].output.a")
    traces = await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)
    assert traces.status_code == 200 and traces.json()["data"] == []
    # The call still waits and takes a storable answer.
    fine = await submit(client, tenant, run_id, {"toolCallId": call_id, "output": {"temp": 18}})
    assert fine.status_code == 200, fine.text
    await wait_for(client, tenant, run_id, "COMPLETED")


# -- Unicode ----------------------------------------------------------------------------------


async def test_a_lone_surrogate_in_run_input_or_a_tool_output_is_a_400_naming_the_field(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, define: DefinitionFactory, harness: Harness
) -> None:
    body = raw_run(task_def, '{"name": "ab\\ud800c"}')
    err = problem(await post_raw(client, tenant, "/v1/workflow-runs", body), 400, "INVALID_UNICODE")
    assert err["path"] == "input.name"
    assert await run_count(harness, tenant) == 0
    # A proper pair (an emoji written as escapes) is fine.
    pair = raw_run(task_def, '{"name": "\\ud83d\\ude00"}')
    assert (await post_raw(client, tenant, "/v1/workflow-runs", pair)).status_code == 201

    run_id = await start(client, tenant, await define([agent(WEATHER)]))
    run = await wait_for(client, tenant, run_id, "WAITING")
    call_id = run["requiredAction"]["toolCalls"][0]["id"]
    body = json.dumps({"toolOutputs": [{"toolCallId": call_id, "output": {"x": "PLACEHOLDER"}}]})
    body = body.replace("PLACEHOLDER", "\\udfff")
    err = problem(
        await post_raw(client, tenant, f"/v1/workflow-runs/{run_id}/tool-outputs", body),
        400,
        "INVALID_UNICODE",
    )
    assert err["path"] == "toolOutputs[0].output.x"


# -- sizes ------------------------------------------------------------------------------------


async def test_bodies_over_the_request_limit_are_413_also_when_chunked(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness
) -> None:
    big = json.dumps({"definitionId": task_def, "input": {"blob": "x" * (70 * 1024)}}).encode()
    declared = await post_raw(client, tenant, "/v1/workflow-runs", big)
    assert problem(declared, 413, "PAYLOAD_TOO_LARGE")["path"] == "body"

    async def chunks() -> AsyncIterator[bytes]:
        for start_at in range(0, len(big), 4096):
            yield big[start_at : start_at + 4096]

    headers = {**tenant.headers, "content-type": "application/json"}
    chunked = await client.post("/v1/workflow-runs", content=chunks(), headers=headers)
    assert "content-length" not in {k.lower() for k in chunked.request.headers}
    assert problem(chunked, 413, "PAYLOAD_TOO_LARGE")["path"] == "body"
    assert chunked.json()["error"]["details"]["limitBytes"] == LIMITS["max_request_bytes"]
    assert await run_count(harness, tenant) == 0


async def test_definitions_run_inputs_and_signal_payloads_have_their_own_limits(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, define: DefinitionFactory, harness: Harness
) -> None:
    definition = {
        "name": new_id("wf"),
        "version": "1",
        "description": "d",
        "steps": [{"type": "task", "name": "t", "handler": "ok", "config": {"blob": "x" * 20_000}}],
    }
    response = await client.post("/v1/workflow-definitions", json=definition, headers=tenant.headers)
    err = problem(response, 413, "PAYLOAD_TOO_LARGE")
    assert err["path"] == "body" and "STEVORA_MAX_DEFINITION_BYTES" in err["message"]
    stored = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_definitions WHERE name = $1", definition["name"]
    )
    assert stored == 0

    response = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": task_def, "input": {"blob": "x" * 9000}},
        headers=tenant.headers,
    )
    err = problem(response, 413, "PAYLOAD_TOO_LARGE")
    assert err["path"] == "input" and response.json()["error"]["details"]["limitBytes"] == 8192
    assert await run_count(harness, tenant) == 0

    run = await start(
        client, tenant, await define([{"type": "external_event", "name": "e", "signalType": "go"}])
    )
    await harness.wait_for_status(run, "WAITING")
    response = await client.post(
        f"/v1/workflow-runs/{run}/resume",
        json={"signalType": "go", "payload": {"blob": "x" * 9000}},
        headers=tenant.headers,
    )
    assert problem(response, 413, "PAYLOAD_TOO_LARGE")["path"] == "payload"


async def test_a_signal_that_would_grow_state_past_its_limit_is_refused_and_nothing_merged(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    async def fill(ctx: Any) -> dict[str, Any]:
        return {"status": "completed", "stateUpdates": {"notes": "n" * 12_000}}

    harness.tasks.register("fill", fill)
    definition_id = await define(
        [
            {"type": "task", "name": "fill", "handler": "fill"},
            {"type": "external_event", "name": "e", "signalType": "go"},
        ]
    )
    run = await start(client, tenant, definition_id)
    await harness.wait_for_status(run, "WAITING")
    response = await client.post(
        f"/v1/workflow-runs/{run}/resume",
        json={"signalType": "go", "payload": {"more": "m" * 6000}},
        headers=tenant.headers,
    )
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "STATE_TOO_LARGE" and error["details"]["limitBytes"] == 16 * 1024
    row = await harness.rt.pool.fetchrow("SELECT status, state FROM workflow_runs WHERE id = $1", run)
    assert row["status"] == "WAITING" and set(row["state"]) == {"notes"}
    # Replacing a key keeps the state small: that merge is fine.
    fine = await client.post(
        f"/v1/workflow-runs/{run}/resume",
        json={"signalType": "go", "payload": {"notes": "short"}},
        headers=tenant.headers,
    )
    assert fine.status_code == 200, fine.text


async def test_a_task_whose_state_update_would_pass_the_state_limit_fails_with_state_too_large(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    async def hoard(ctx: Any) -> dict[str, Any]:
        return {"status": "completed", "stateUpdates": {"hoard": "h" * 20_000}}

    harness.tasks.register("hoard", hoard)
    run = await start(client, tenant, await define([{"type": "task", "name": "h", "handler": "hoard"}]))
    row = await harness.wait_for_status(run, "FAILED")
    assert row["error"]["code"] == "STATE_TOO_LARGE"
    assert row["state"] == {}
    steps = await harness.rt.pool.fetch("SELECT status FROM step_runs WHERE workflow_run_id = $1", run)
    assert [s["status"] for s in steps] == ["FAILED"], "not retried: the same update would be refused again"


async def test_a_tools_update_state_past_the_limit_is_a_failed_call_the_model_reads(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    async def remember(input: dict[str, Any], ctx: ToolContext) -> str:
        ctx.update_state({"memory": "m" * 20_000})
        return "remembered"

    harness.tools.register("remember", remember, parameters={"type": "object", "properties": {}})
    run_id = await start(client, tenant, await define([agent("remember")]))
    await harness.wait_for_status(run_id, "COMPLETED")
    traces = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ]
    assert [(t["status"], t["errorCode"]) for t in traces] == [("failed", "STATE_TOO_LARGE")]
    row = await harness.rt.pool.fetchrow("SELECT state FROM workflow_runs WHERE id = $1", run_id)
    assert "memory" not in row["state"]


async def test_run_list_items_leave_out_large_fields_that_get_returns(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness
) -> None:
    small = await client.post(
        "/v1/workflow-runs", json={"definitionId": task_def, "input": {"a": 1}}, headers=tenant.headers
    )
    large_input = {"blob": "x" * 3000}
    large = await client.post(
        "/v1/workflow-runs", json={"definitionId": task_def, "input": large_input}, headers=tenant.headers
    )
    for created in (small, large):
        await harness.wait_for_status(created.json()["data"]["id"], "COMPLETED")
    # 10240 bytes per page of 2: 1706 bytes per large field and item (3413 for a page of 1).
    listed = await client.get("/v1/workflow-runs?pageSize=2", headers=tenant.headers)
    assert listed.status_code == 200, listed.text
    items = {item["id"]: item for item in listed.json()["data"]}
    small_item = items[small.json()["data"]["id"]]
    large_item = items[large.json()["data"]["id"]]
    assert small_item["input"] == {"a": 1} and small_item["omittedFields"] == []
    assert large_item["input"] is None and large_item["omittedFields"] == ["input"]
    assert large_item["state"] == {} and large_item["output"] == {} and large_item["status"] == "COMPLETED"
    got = await client.get(f"/v1/workflow-runs/{large_item['id']}", headers=tenant.headers)
    assert got.json()["data"]["input"] == large_input
    # With one item per page the share is larger: the input fits again.
    one = await client.get("/v1/workflow-runs?pageSize=1&page=1", headers=tenant.headers)
    assert one.json()["data"][0]["omittedFields"] == []


# -- small 500s -------------------------------------------------------------------------------


async def test_last_event_id_and_after_beyond_a_sequence_are_400_not_500(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness
) -> None:
    created = await client.post("/v1/workflow-runs", json={"definitionId": task_def}, headers=tenant.headers)
    run_id = created.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")
    url = f"/v1/workflow-runs/{run_id}/events/stream"
    for value in ("²", "٣", "99999999999"):
        response = await client.get(url, headers={**tenant.headers, "Last-Event-ID": value.encode()})
        assert problem(response, 400, "VALIDATION_ERROR")["path"] == "Last-Event-ID"
    response = await client.get(f"{url}?after=4294967296", headers=tenant.headers)
    assert problem(response, 400, "VALIDATION_ERROR")["path"] == "after"
    ok = await client.get(url, headers={**tenant.headers, "Last-Event-ID": "1"})
    assert ok.status_code == 200 and "id: 2" in ok.text


async def test_a_webhook_url_with_port_99999_is_a_400_naming_the_url(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    for url in ("https://example.com:99999/hook", "https://example.com:0/hook"):
        response = await client.post(
            "/v1/webhooks", json={"url": url, "events": ["workflow.completed"]}, headers=tenant.headers
        )
        err = problem(response, 400, "VALIDATION_ERROR")
        assert err["path"] == "url" and "port" in err["message"]
    stored = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM webhooks WHERE workspace_id = $1", tenant.workspace_id
    )
    assert stored == 0


async def test_the_ui_stream_with_after_beyond_int32_streams_instead_of_failing(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness
) -> None:
    created = await client.post("/v1/workflow-runs", json={"definitionId": task_def}, headers=tenant.headers)
    run_id = created.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")
    client.cookies.set(COOKIE_NAME, tenant.key)
    response = await client.get(f"/ui/runs/{run_id}/stream?after=99999999999")
    assert response.status_code == 200
    assert "WORKFLOW_COMPLETED" in response.text


# -- odd content already stored ---------------------------------------------------------------

# Rows written before these limits (or by hand): the 400-digit integer the issue found wedged a run.
ODD_INPUT = '{"amount": ' + "7" * 400 + "}"
ODD_STATE = '{"deep": ' + "[" * 300 + "]" * 300 + "}"


async def test_cancel_pause_retry_and_the_run_page_work_on_a_run_holding_odd_stored_content(
    client: httpx.AsyncClient, tenant: Tenant, task_def: str, harness: Harness
) -> None:
    ids = []
    for status in ("WAITING", "RUNNING", "FAILED"):
        run_id = new_id("wfrun")
        await harness.rt.pool.execute(
            "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, state) "
            "VALUES ($1, $2, $3, $4, $5::text::jsonb, $6::text::jsonb)",
            run_id,
            tenant.workspace_id,
            task_def,
            status,
            ODD_INPUT,
            ODD_STATE,
        )
        ids.append(run_id)
    waiting, running, failed = ids
    step_id = new_id("srun")
    await harness.rt.pool.execute(
        "INSERT INTO step_runs (id, workflow_run_id, step_name, step_type, step_index, visit, attempt, status) "
        "VALUES ($1, $2, 't', 'task', 0, 1, 1, 'FAILED')",
        step_id,
        failed,
    )
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET current_step_run_id = $2, current_step_name = 't' WHERE id = $1",
        failed,
        step_id,
    )
    client.cookies.set(COOKIE_NAME, tenant.key)
    page = await client.get(f"/ui/runs/{waiting}")
    assert page.status_code == 200
    listed = await client.get("/v1/workflow-runs", headers=tenant.headers)
    assert listed.status_code == 200
    paused = await client.post(f"/v1/workflow-runs/{running}/pause", headers=tenant.headers)
    assert paused.status_code == 200, paused.text
    for run_id in (waiting, running):
        cancelled = await client.post(f"/v1/workflow-runs/{run_id}/cancel", headers=tenant.headers)
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["data"]["status"] == "CANCELLED"
        data = cancelled.json()["data"]
        assert data["input"]["amount"] == int("7" * 400)  # read exactly, not as a float
        assert data["state"] == {"$unreadable": "This value is nested too deeply to be returned"}
    retried = await client.post(f"/v1/workflow-runs/{failed}/retry", headers=tenant.headers)
    assert retried.status_code == 200, retried.text
    assert retried.json()["data"]["input"]["amount"] == int("7" * 400)


async def test_an_inline_definition_is_checked_before_it_is_stored(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    async def definitions() -> int:
        count: int = await harness.rt.pool.fetchval(
            "SELECT count(*) FROM workflow_definitions WHERE workspace_id = $1", tenant.workspace_id
        )
        return count

    steps = [{"type": "task", "name": "t", "handler": "ok", "config": {"blob": "x" * 20_000}}]
    response = await client.post(
        "/v1/workflow-runs", json={"definition": {"steps": steps}}, headers=tenant.headers
    )
    assert problem(response, 413, "PAYLOAD_TOO_LARGE")["path"] == "definition"
    small = {"steps": [{"type": "task", "name": "t", "handler": "ok"}]}
    response = await client.post(
        "/v1/workflow-runs", json={"definition": small, "input": {"blob": "x" * 9000}}, headers=tenant.headers
    )
    assert problem(response, 413, "PAYLOAD_TOO_LARGE")["path"] == "input"
    body = '{"definition": {"steps": [{"type": "task", "name": "t", "handler": "ok", "config": {"n": NaN}}]}}'
    err = problem(await post_raw(client, tenant, "/v1/workflow-runs", body), 400, "INVALID_NUMBER")
    assert err["path"] == "definition.steps[0].config.n"
    assert await definitions() == 0 and await run_count(harness, tenant) == 0


async def test_a_handler_output_that_cannot_be_stored_is_a_failed_call_not_a_crash(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    async def odd(input: dict[str, Any]) -> dict[str, Any]:
        return {"id": 2**70, "name": "ab\ud800"}

    harness.tools.register("odd", odd, parameters={"type": "object", "properties": {}})
    run_id = await start(client, tenant, await define([agent("odd")]))
    await harness.wait_for_status(run_id, "COMPLETED")
    traces = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ]
    assert [(t["status"], t["errorCode"]) for t in traces] == [("failed", "TOOL_OUTPUT_INVALID")]
    assert "output.id" in traces[0]["error"]
