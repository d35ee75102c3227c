import asyncio
import enum
import json
import threading
import time
from typing import Any

import pytest
import structlog
import structlog.testing
from pydantic import BaseModel, Field

from stevora.tools import DeclaredSchemas, OutputLimits, ToolContext, ToolOutcome, ToolRegistry, invoke_tool

CONTEXT = ToolContext(
    idempotency_key="sr_1:2:0",
    workflow_run_id="run_1",
    workspace_id="ws_1",
    step_run_id="sr_1",
    step_name="research-agent",
    round=2,
    call_index=0,
    tool_call_id="call_abc",
)
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str = "NO"


class Forecast(BaseModel):
    city: str
    temperature: float


async def run(
    registry: ToolRegistry,
    name: str,
    raw: str,
    *,
    declared_schema: dict[str, Any] | None = None,
    timeout_s: float = 5.0,
    max_output_bytes: int = 10_000,
) -> ToolOutcome:
    return await invoke_tool(
        registry,
        name,
        raw,
        context=CONTEXT,
        timeout_s=timeout_s,
        limits=OutputLimits(max_output_bytes),
        declared=DeclaredSchemas(arguments=declared_schema),
    )


async def test_unregistered_tool_fails_and_tells_the_model() -> None:
    outcome = await run(ToolRegistry(), "get_weather", '{"city": "Oslo"}')
    assert outcome.status == "failed" and outcome.error_code == "TOOL_NOT_REGISTERED"
    assert outcome.error == "Tool 'get_weather' not registered"
    assert outcome.result_text == json.dumps({"error": "Tool 'get_weather' not registered"})
    assert outcome.input == {"city": "Oslo"} and outcome.output is None


async def test_async_handler_output_round_trips_as_json() -> None:
    registry = ToolRegistry()

    async def get_weather(input: dict[str, Any]) -> dict[str, Any]:
        return {"city": input["city"], "temps": (1, 2), "note": "søt"}

    registry.register("get_weather", get_weather, parameters=WEATHER_SCHEMA)
    outcome = await run(registry, "get_weather", '{"city": "Oslo", "days": 2}')
    assert outcome.status == "completed" and outcome.error is None and outcome.error_code is None
    assert outcome.input == {"city": "Oslo", "days": 2}
    assert outcome.output == {"city": "Oslo", "temps": [1, 2], "note": "søt"}
    assert outcome.result_text == '{"city": "Oslo", "temps": [1, 2], "note": "søt"}'
    assert outcome.duration_ms >= 0 and outcome.ok


async def test_string_output_is_sent_to_the_model_as_is() -> None:
    registry = ToolRegistry()
    registry.register("echo", lambda input: "plain text, not JSON")
    outcome = await run(registry, "echo", "{}")
    assert outcome.result_text == "plain text, not JSON"
    assert outcome.output == "plain text, not JSON"


async def test_pydantic_model_output_is_dumped_in_json_mode() -> None:
    registry = ToolRegistry()

    async def forecast(input: dict[str, Any]) -> list[Forecast]:
        return [Forecast(city="Oslo", temperature=3.5)]

    registry.register("forecast", forecast)
    outcome = await run(registry, "forecast", "")
    assert outcome.output == [{"city": "Oslo", "temperature": 3.5}]
    assert json.loads(outcome.result_text) == outcome.output


async def test_sync_handler_runs_in_a_worker_thread() -> None:
    registry = ToolRegistry()
    seen: list[int] = []

    def blocking(input: dict[str, Any]) -> int:
        seen.append(threading.get_ident())
        return 42

    registry.register("blocking", blocking)
    outcome = await run(registry, "blocking", "{}")
    assert outcome.output == 42 and outcome.result_text == "42"
    assert seen and seen[0] != threading.get_ident()


async def test_two_argument_handler_receives_the_tool_context() -> None:
    registry = ToolRegistry()
    received: list[ToolContext] = []

    async def charge(input: dict[str, Any], ctx: ToolContext) -> str:
        received.append(ctx)
        return ctx.idempotency_key

    registry.register("charge", charge)
    outcome = await run(registry, "charge", '{"amount": 5}')
    assert received == [CONTEXT]
    assert outcome.output == "sr_1:2:0"


async def test_empty_arguments_are_an_empty_object() -> None:
    registry = ToolRegistry()
    seen: list[dict[str, Any]] = []
    registry.register("t", lambda input: seen.append(input))
    outcome = await run(registry, "t", "")
    assert seen == [{}] and outcome.input == {} and outcome.status == "completed"


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"a string"'])
async def test_unparseable_or_non_object_arguments_reach_the_handler_as_raw(raw: str) -> None:
    registry = ToolRegistry()
    seen: list[dict[str, Any]] = []

    async def handler(input: dict[str, Any]) -> str:
        seen.append(input)
        return "ok"

    registry.register("get_weather", handler, parameters=WEATHER_SCHEMA)
    outcome = await run(registry, "get_weather", raw)
    # Schema validation is skipped (it would demand "city"): the handler decides.
    assert seen == [{"raw": raw}]
    assert outcome.status == "completed" and outcome.input == {"raw": raw}


async def test_validation_error_names_every_bad_field_and_skips_the_handler() -> None:
    registry = ToolRegistry()
    calls: list[Any] = []
    registry.register("get_weather", lambda input: calls.append(input), parameters=WEATHER_SCHEMA)
    outcome = await run(registry, "get_weather", '{"days": "x"}')
    message = (
        "Invalid arguments for tool 'get_weather': city: 'city' is a required property; "
        "days: 'x' is not of type 'integer'"
    )
    assert outcome.status == "failed" and outcome.error_code == "INVALID_ARGUMENTS"
    assert outcome.error == message
    assert outcome.result_text == json.dumps({"error": message})
    assert outcome.input == {"days": "x"}
    assert calls == []


async def test_validation_errors_use_json_paths_for_nested_and_unexpected_fields() -> None:
    registry = ToolRegistry()

    @registry.tool
    def ship(place: Place, count: int) -> None: ...

    outcome = await run(registry, "ship", '{"place": {"country": 1}, "count": 1, "extra": true}')
    assert outcome.error == (
        "Invalid arguments for tool 'ship': extra: 'extra' is not an allowed property; "
        "place.city: 'city' is a required property; place.country: 1 is not of type 'string'"
    )


async def test_declared_step_schema_takes_precedence_over_the_registered_one() -> None:
    registry = ToolRegistry()
    registry.register("get_weather", lambda input: "ok", parameters=WEATHER_SCHEMA)
    declared = {"type": "object", "properties": {"zip": {"type": "string"}}, "required": ["zip"]}
    failed = await run(registry, "get_weather", '{"city": "Oslo"}', declared_schema=declared)
    passed = await run(registry, "get_weather", '{"zip": "0150"}', declared_schema=declared)
    assert failed.error == "Invalid arguments for tool 'get_weather': zip: 'zip' is a required property"
    assert passed.status == "completed"


async def test_handler_exception_is_a_failed_outcome_with_the_message_for_the_model() -> None:
    registry = ToolRegistry()

    async def broken(input: dict[str, Any]) -> None:
        raise ValueError("customer not found")

    def silent(input: dict[str, Any]) -> None:
        raise KeyError

    registry.register("broken", broken)
    registry.register("silent", silent)
    outcome = await run(registry, "broken", "{}")
    assert outcome.status == "failed" and outcome.error_code == "TOOL_ERROR"
    assert outcome.error == "ValueError: customer not found"
    assert outcome.result_text == json.dumps({"error": "customer not found"})
    silent_outcome = await run(registry, "silent", "{}")
    assert silent_outcome.result_text == json.dumps({"error": "KeyError"})


async def test_timeout_error_raised_by_the_handler_is_not_reported_as_a_timeout() -> None:
    registry = ToolRegistry()

    async def upstream_timeout(input: dict[str, Any]) -> None:
        raise TimeoutError("upstream timed out")

    registry.register("t", upstream_timeout)
    outcome = await run(registry, "t", "{}")
    assert outcome.error_code == "TOOL_ERROR"
    assert outcome.error == "TimeoutError: upstream timed out"


async def test_slow_handler_times_out_quickly() -> None:
    registry = ToolRegistry()

    async def slow(input: dict[str, Any]) -> str:
        await asyncio.sleep(1)
        return "too late"

    registry.register("slow", slow)
    started = time.perf_counter()
    outcome = await run(registry, "slow", "{}", timeout_s=0.05)
    assert time.perf_counter() - started < 0.5
    assert outcome.status == "failed" and outcome.error_code == "TOOL_TIMEOUT"
    assert outcome.error == "Tool 'slow' timed out after 0.05s"
    assert outcome.result_text == json.dumps({"error": "Tool 'slow' timed out after 0.05s"})


async def test_registered_timeout_ms_overrides_the_step_timeout() -> None:
    registry = ToolRegistry()

    async def slow(input: dict[str, Any]) -> None:
        await asyncio.sleep(1)

    registry.register("slow", slow, timeout_ms=20)
    started = time.perf_counter()
    outcome = await run(registry, "slow", "{}", timeout_s=30)
    assert time.perf_counter() - started < 0.5
    assert outcome.error == "Tool 'slow' timed out after 0.02s"


async def test_cancellation_propagates_instead_of_becoming_an_outcome() -> None:
    registry = ToolRegistry()
    started = asyncio.Event()

    async def waits(input: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(10)

    async def cancels_itself(input: dict[str, Any]) -> None:
        raise asyncio.CancelledError

    registry.register("waits", waits)
    registry.register("cancels_itself", cancels_itself)
    task = asyncio.create_task(run(registry, "waits", "{}"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(asyncio.CancelledError):
        await run(registry, "cancels_itself", "{}")


async def test_oversize_output_fails_instead_of_sending_a_truncated_blob() -> None:
    registry = ToolRegistry()
    registry.register("big", lambda input: {"data": "x" * 100})
    registry.register("accents", lambda input: "é" * 6)
    outcome = await run(registry, "big", "{}", max_output_bytes=50)
    message = "Tool output is 112 bytes, over the 50-byte limit"
    assert outcome.status == "failed" and outcome.error_code == "TOOL_OUTPUT_TOO_LARGE"
    assert outcome.error == message
    assert outcome.result_text == json.dumps({"error": message})
    assert outcome.output is None
    accents = await run(registry, "accents", "{}", max_output_bytes=10)
    assert accents.error == "Tool output is 12 bytes, over the 10-byte limit"
    fits = await run(registry, "accents", "{}", max_output_bytes=12)
    assert fits.status == "completed"


async def test_output_that_is_not_valid_json_fails_as_a_tool_error() -> None:
    registry = ToolRegistry()
    registry.register("nan", lambda input: {"value": float("nan")})
    outcome = await run(registry, "nan", "{}")
    assert outcome.error_code == "TOOL_ERROR"
    assert outcome.error is not None and outcome.error.startswith("Tool output is not JSON-serialisable")


async def test_decorated_tool_gets_keyword_arguments_models_enums_and_context() -> None:
    registry = ToolRegistry()
    seen: dict[str, Any] = {}

    @registry.tool
    async def book(
        place: Place, unit: Unit, ctx: ToolContext, nights: int = Field(1, ge=1)
    ) -> dict[str, Any]:
        seen.update(place=place, unit=unit, ctx=ctx, nights=nights)
        return {"key": ctx.idempotency_key, "city": place.city}

    outcome = await run(registry, "book", '{"place": {"city": "Oslo"}, "unit": "celsius"}')
    assert outcome.status == "completed", outcome.error
    assert seen == {"place": Place(city="Oslo"), "unit": Unit.C, "ctx": CONTEXT, "nights": 1}
    assert outcome.output == {"key": "sr_1:2:0", "city": "Oslo"}


async def test_decorated_tool_reports_arguments_a_step_schema_let_through() -> None:
    registry = ToolRegistry()

    @registry.tool
    def ship(city: str) -> str:
        return city

    loose = {"type": "object"}
    outcome = await run(registry, "ship", '{"town": "Oslo"}', declared_schema=loose)
    assert outcome.error_code == "INVALID_ARGUMENTS"
    assert outcome.error == (
        "Invalid arguments for tool 'ship': town: unexpected argument; city: missing required argument"
    )
    raw = await run(registry, "ship", "not json")
    assert raw.error_code == "INVALID_ARGUMENTS" and raw.input == {"raw": "not json"}


async def test_handler_cannot_rewrite_the_recorded_input() -> None:
    registry = ToolRegistry()

    def mutates(input: dict[str, Any]) -> str:
        input["injected"] = True
        return "done"

    registry.register("mutates", mutates)
    outcome = await run(registry, "mutates", '{"a": 1}')
    assert outcome.input == {"a": 1}


async def test_handler_exception_is_logged_with_its_traceback_but_never_sent_to_the_model() -> None:
    registry = ToolRegistry()

    async def broken(input: dict[str, Any]) -> None:
        raise ValueError("customer not found")

    registry.register("broken", broken)
    with structlog.testing.capture_logs() as logs:
        outcome = await run(registry, "broken", "{}")
    [entry] = [e for e in logs if e["event"] == "tool_call_failed"]
    assert entry["tool_name"] == "broken" and entry["idempotency_key"] == CONTEXT.idempotency_key
    exc = entry["exc_info"]
    assert isinstance(exc, ValueError) and exc.__traceback__ is not None
    rendered = structlog.processors.format_exc_info(None, "", dict(entry))["exception"]
    assert "Traceback" in rendered and "in broken" in rendered
    assert "Traceback" not in outcome.result_text and "in broken" not in outcome.result_text
    assert outcome.error is not None and "Traceback" not in outcome.error
