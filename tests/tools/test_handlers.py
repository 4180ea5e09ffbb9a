"""In-process tool handlers: handler shapes, argument checks, and errors as results."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, InputError, ToolResult, ToolSpec, ToolUse
from turnkeeper.events import Envelope, ToolCalled, ToolReturned, encode_envelope
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, run
from turnkeeper.tools._handlers import (
    MAX_TOOL_RESULT_CHARS,
    ToolContext,
    as_handler,
    as_text,
    check_call,
    coerce_call,
    cut_result,
    run_each,
    run_tool,
)

WEATHER = ToolSpec(
    "weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"],
    },
)
SPEC = AgentSpec(tools=(WEATHER, ToolSpec("clock")))
CTX = ToolContext("local_0123456789abcdef", "call_1", "weather")


def use(name: str = "weather", args: dict[str, Any] | None = None, **kw: Any) -> ToolUse:
    return ToolUse("call_1", name, {"city": "Oslo"} if args is None else args, **kw)


# as_handler


async def weather(city: str, days: int = 1) -> str:
    return f"{city}: sunny for {days} day(s)"


@pytest.mark.anyio
async def test_mapping_calls_the_named_function_with_keyword_arguments() -> None:
    async def clock() -> str:
        return "noon"

    handler = as_handler({"weather": weather, "clock": clock})
    assert await handler("weather", {"city": "Oslo", "days": 3}, CTX) == "Oslo: sunny for 3 day(s)"
    assert await handler("clock", {}, CTX) == "noon"


@pytest.mark.anyio
async def test_mapping_refuses_an_unknown_tool_naming_the_handled_ones() -> None:
    handler = as_handler({"weather": weather, "clock": weather})
    with pytest.raises(
        LookupError, match=r"no handler for tool 'radar' \(handled: clock, weather\)"
    ):
        await handler("radar", {}, CTX)
    with pytest.raises(LookupError, match=r"handled: none"):
        await as_handler({})("radar", {}, CTX)


@pytest.mark.anyio
async def test_mapping_takes_plain_functions_and_ones_returning_an_awaitable() -> None:
    charged: list[int] = []

    def charge(amount: int) -> str:
        charged.append(amount)
        return f"charged {amount}"

    handler = as_handler({"charge": charge, "later": lambda city: weather(city)})
    assert await handler("charge", {"amount": 5}, CTX) == "charged 5"
    assert charged == [5]
    assert await handler("later", {"city": "Oslo"}, CTX) == "Oslo: sunny for 1 day(s)"


@pytest.mark.anyio
async def test_mapping_is_copied_so_later_changes_do_not_leak_in() -> None:
    functions = {"weather": weather}
    handler = as_handler(functions)
    del functions["weather"]
    assert await handler("weather", {"city": "Rome"}, CTX) == "Rome: sunny for 1 day(s)"


@pytest.mark.anyio
async def test_single_handler_is_used_as_given() -> None:
    calls: list[tuple[str, dict[str, Any], ToolContext]] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        calls.append((name, args, ctx))
        return "ok"

    assert as_handler(handler) is handler
    assert await as_handler(handler)("weather", {"city": "Oslo"}, CTX) == "ok"
    assert calls == [("weather", {"city": "Oslo"}, CTX)]


@pytest.mark.parametrize("tools", [42, "weather", None])
def test_non_callable_tools_are_rejected_clearly(tools: Any) -> None:
    with pytest.raises(InputError, match=r"tools: expected a handler or a mapping"):
        as_handler(tools)


def test_non_callable_tool_function_is_rejected_by_name() -> None:
    with pytest.raises(InputError, match=r"tools\['clock'\]: expected a function, got 'noon'"):
        as_handler({"weather": weather, "clock": "noon"})  # type: ignore[dict-item]


# check_call


def test_a_good_call_may_run() -> None:
    assert check_call(SPEC, use()) is None
    assert check_call(SPEC, use(args={"city": "Oslo", "days": 2})) is None
    assert check_call(SPEC, use("clock", {})) is None


def test_malformed_arguments_say_why_and_how_to_fix() -> None:
    bad = use(args={}, error="arguments are not valid JSON (truncated): '{\"city'")
    refusal = check_call(SPEC, bad)
    assert refusal is not None
    assert refusal.startswith("Error: arguments are not valid JSON (truncated)")
    assert "Call weather again with a JSON object" in refusal


def test_malformed_arguments_are_refused_even_without_tools_in_the_spec() -> None:
    assert check_call(AgentSpec(), use(args={}, error="not JSON")) is not None


def test_unknown_tool_lists_the_tools() -> None:
    refusal = check_call(SPEC, use("radar", {}))
    assert refusal == "Error: unknown tool 'radar'. The tools are: weather, clock. Try again."


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({"city": 7}, "$.city"),
        ({"city": "Oslo", "days": 0}, "$.days"),
        ({}, "city"),
    ],
)
def test_schema_invalid_arguments_name_the_path(args: dict[str, Any], path: str) -> None:
    refusal = check_call(SPEC, use(args=args))
    assert refusal is not None
    assert refusal.startswith("Error: invalid arguments for weather: ")
    assert path in refusal
    assert refusal.endswith(". Try again.")


def test_every_schema_problem_is_listed() -> None:
    refusal = check_call(SPEC, use(args={"city": 7, "days": "two"}))
    assert refusal is not None
    assert "$.city" in refusal
    assert "$.days" in refusal
    assert "; " in refusal


def test_a_spec_without_tools_allows_any_call() -> None:
    assert check_call(AgentSpec(), use("anything", {"x": [1, 2]})) is None


def test_arguments_are_checked_after_the_safe_coercions() -> None:
    assert check_call(SPEC, use(args={"city": "Oslo", "days": "2"})) is None
    refusal = check_call(SPEC, use(args={"city": "Oslo", "days": "0"}))
    assert refusal is not None
    assert "$.days: 0 is less than the minimum 1" in refusal


# coerce_call


def test_coerce_call_gives_the_handler_coerced_arguments() -> None:
    given = use(args={"city": "Oslo", "days": "2"})
    assert coerce_call(SPEC, given) == ToolUse("call_1", "weather", {"city": "Oslo", "days": 2})
    assert given.input == {"city": "Oslo", "days": "2"}


@pytest.mark.parametrize(
    "given",
    [
        use(args={"city": "Oslo", "days": 2}),
        use(args={"city": "Oslo", "days": "two"}),
        use("radar", {"days": "2"}),
    ],
)
def test_coerce_call_keeps_what_it_need_not_change(given: ToolUse) -> None:
    assert coerce_call(SPEC, given) is given


@pytest.mark.anyio
async def test_run_hands_coerced_arguments_to_the_handler_and_logs_them() -> None:
    seen: list[dict[str, Any]] = []

    async def weather(city: str, days: int = 1) -> str:
        seen.append({"city": city, "days": days})
        return "sunny"

    chat = ScriptedChat(
        [tool_response(("weather", {"city": "Oslo", "days": "3"})), text_response("Sunny.")]
    )
    result = await run(SPEC, "Weather?", chat, tools={"weather": weather})
    assert seen == [{"city": "Oslo", "days": 3}]
    [called] = [e.event for e in result.events if isinstance(e.event, ToolCalled)]
    assert called.input == {"city": "Oslo", "days": 3}


@pytest.mark.anyio
async def test_a_host_hands_coerced_arguments_to_the_handler_and_logs_them() -> None:
    seen: list[dict[str, Any]] = []

    async def weather(city: str, days: int = 1) -> str:
        seen.append({"city": city, "days": days})
        return "sunny"

    chat = ScriptedChat(
        [tool_response(("weather", {"city": "Oslo", "days": "3"})), text_response("Sunny.")]
    )
    async with Host(chat=chat, log=MemoryLog(), tools={"weather": weather}) as host:
        session_id = await host.start(SPEC, "Weather?")
        assert (await host.result(session_id, wait=30)).status == "idle"
        events = await host.events(session_id)
    assert seen == [{"city": "Oslo", "days": 3}]
    [called] = [e.event for e in events if isinstance(e.event, ToolCalled)]
    assert called.input == {"city": "Oslo", "days": 3}


# as_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        ("", ""),
        ({"b": 1, "a": [True, None]}, '{"b":1,"a":[true,null]}'),
        ([1, 2.5], "[1,2.5]"),
        (3, "3"),
        (None, "null"),
    ],
)
def test_as_text(value: Any, text: str) -> None:
    assert as_text(value) == text


def test_as_text_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(TypeError):
        as_text(object())


# run_tool


async def run_one(handler: Any, call: ToolUse | None = None, **kw: Any) -> ToolResult:
    return await run_tool(handler, call or use(), CTX, **kw)


@pytest.mark.anyio
async def test_text_result() -> None:
    result = await run_one(as_handler({"weather": weather}))
    assert result == ToolResult("call_1", "Oslo: sunny for 1 day(s)", is_error=False)


@pytest.mark.anyio
async def test_handler_gets_name_arguments_and_context() -> None:
    seen: list[tuple[str, dict[str, Any], ToolContext]] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append((name, args, ctx))
        return "ok"

    await run_one(handler, use(args={"city": "Lima"}))
    assert seen == [("weather", {"city": "Lima"}, CTX)]


@pytest.mark.anyio
async def test_json_encodable_result_is_sent_as_json() -> None:
    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        return {"city": args["city"], "temps": [3, 4.5], "rain": None}

    result = await run_one(handler)
    assert not result.is_error
    assert json.loads(result.text) == {"city": "Oslo", "temps": [3, 4.5], "rain": None}


@pytest.mark.anyio
@pytest.mark.parametrize(
    "value",
    [object(), {"when": object()}, {"text": "\ud800"}],
    ids=["object", "nested-object", "lone-surrogate"],
)
async def test_unencodable_result_becomes_an_error_result(value: Any) -> None:
    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        return value

    result = await run_one(handler)
    assert result.is_error
    assert result.tool_use_id == "call_1"
    assert result.text.startswith(f"weather returned {type(value).__name__}, not text: ")


@pytest.mark.anyio
async def test_self_containing_result_becomes_an_error_result() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        return loop

    result = await run_one(handler)
    assert result.is_error
    assert "not text" in result.text


@pytest.mark.anyio
async def test_raising_handler_becomes_an_error_result_with_type_and_message() -> None:
    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        raise KeyError("no station in Oslo")

    result = await run_one(handler)
    assert result == ToolResult("call_1", "KeyError: 'no station in Oslo'", is_error=True)


# A file name that is not UTF-8, as os.listdir and os.fsdecode give it: a lone surrogate.
NOT_UTF8 = os.fsdecode(b"/tmp/no-such-\xff-file")


@pytest.mark.anyio
async def test_a_lone_surrogate_in_a_handlers_error_becomes_a_question_mark() -> None:
    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        raise ValueError(f"{NOT_UTF8}: not a text file")

    result = await run_one(handler)
    assert result == ToolResult(
        "call_1", "ValueError: /tmp/no-such-?-file: not a text file", is_error=True
    )
    encode_envelope(Envelope("s", 1, 1.0, ToolReturned("call_1", result.text, is_error=True)))


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


@pytest.mark.anyio
async def test_every_error_result_a_handler_shapes_can_be_logged() -> None:
    async def unprintable(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        raise Unprintable()

    async def foreign(name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        return object()

    async def slow(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        await anyio.sleep_forever()
        return "never"

    broken = await run_one(unprintable)
    assert broken == ToolResult(
        "call_1", "Unprintable: (its message could not be made: RuntimeError)", is_error=True
    )
    # A tool name is the model's: it may hold a lone surrogate too.
    returned = await run_one(foreign, use("w\udcff"))
    assert returned.is_error
    assert returned.text.startswith("w? returned object, not text: ")
    timed_out = await run_one(slow, use("w\udcff"), timeout=0.01)
    assert timed_out == ToolResult("call_1", "w? timed out after 0.01 s", is_error=True)


@pytest.mark.anyio
async def test_a_host_sends_a_handlers_error_holding_a_lone_surrogate_to_the_model() -> None:
    runs: list[str] = []

    async def weather(city: str) -> str:
        runs.append(city)
        raise ValueError(f"{NOT_UTF8}: not a text file")

    chat = ScriptedChat([tool_response(("weather", {"city": "Oslo"})), text_response("No file.")])
    log = MemoryLog()
    async with Host(chat=chat, log=log, tools={"weather": weather}) as host:
        session_id = await host.start(SPEC, "Weather?")
        assert (await host.result(session_id, wait=30)).status == "idle"
    assert runs == ["Oslo"]
    [returned] = [e.event for e in await log.read(session_id) if isinstance(e.event, ToolReturned)]
    assert returned == ToolReturned(
        "call_1", "ValueError: /tmp/no-such-?-file: not a text file", is_error=True
    )


class Stray(BaseException):
    """A BaseException of a handler's or backend's own, which stops nothing but its call."""


async def cancelled_elsewhere() -> None:
    """Raise what awaiting a future that other code cancelled raises: on asyncio, a
    CancelledError while nothing cancelled this task; on trio, which has no such thing,
    a BaseException of the caller's own."""
    if anyio.get_cancelled_exc_class() is asyncio.CancelledError:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future
    raise Stray("a future of another task was cancelled")


@pytest.mark.anyio
async def test_a_stray_base_exception_is_an_error_result() -> None:
    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        await cancelled_elsewhere()
        return "never"

    for timeout in (None, 60.0):
        result = await run_one(handler, timeout=timeout)
        assert result.is_error
        assert result.text.startswith(("CancelledError", "Stray: a future"))


@pytest.mark.anyio
@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
async def test_what_stops_the_process_is_not_an_error_result(stop: type[BaseException]) -> None:
    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        raise stop()

    with pytest.raises(stop):
        await run_one(handler)


@pytest.mark.anyio
async def test_a_cancellation_of_the_caller_goes_through() -> None:
    started = anyio.Event()

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        started.set()
        await anyio.sleep_forever()
        return "never"

    results: list[ToolResult] = []
    async with anyio.create_task_group() as group:

        async def call() -> None:
            results.append(await run_one(handler))

        group.start_soon(call)
        await started.wait()
        group.cancel_scope.cancel()
    assert results == []
    assert group.cancel_scope.cancelled_caught


@pytest.mark.anyio
async def test_mapping_errors_become_error_results() -> None:
    handler = as_handler({"weather": weather})
    unknown = await run_one(handler, use("radar", {}))
    assert unknown.is_error
    assert unknown.text.startswith("LookupError: no handler for tool 'radar'")
    wrong = await run_one(handler, use(args={"town": "Oslo"}))
    assert wrong.is_error
    assert wrong.text.startswith("TypeError: ")
    assert "town" in wrong.text


@pytest.mark.anyio
async def test_slow_handler_times_out_as_an_error_result() -> None:
    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        await anyio.sleep_forever()
        return "never"

    result = await run_one(handler, timeout=0.01)
    assert result == ToolResult("call_1", "weather timed out after 0.01 s", is_error=True)


@pytest.mark.anyio
async def test_a_timeout_does_not_touch_a_handler_that_finishes() -> None:
    result = await run_one(as_handler({"weather": weather}), timeout=60)
    assert result == ToolResult("call_1", "Oslo: sunny for 1 day(s)")


@pytest.mark.anyio
async def test_sync_handler_returning_a_value_works() -> None:
    def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        return {"city": args["city"]}

    result = await run_one(handler)
    assert result == ToolResult("call_1", '{"city":"Oslo"}')


@pytest.mark.anyio
async def test_sync_handler_that_raises_becomes_an_error_result() -> None:
    def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        raise ValueError("bad city")

    result = await run_one(handler)
    assert result == ToolResult("call_1", "ValueError: bad city", is_error=True)


@pytest.mark.anyio
async def test_cancellation_from_outside_propagates_and_is_not_a_result() -> None:
    started = anyio.Event()
    outcomes: list[ToolResult] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        started.set()
        await anyio.sleep_forever()
        return "never"

    async def call() -> None:
        outcomes.append(await run_one(handler, timeout=3600))

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await started.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert outcomes == []


@pytest.mark.anyio
async def test_cancellation_without_a_timeout_also_propagates() -> None:
    outcomes: list[ToolResult] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        await anyio.sleep_forever()
        return "never"

    with anyio.move_on_after(0.01) as scope:
        outcomes.append(await run_one(handler))
    assert scope.cancelled_caught
    assert outcomes == []


# call order


ORDERED = AgentSpec(tools=(ToolSpec("step", "", {"type": "object"}),))
BACKENDS = ["asyncio", "trio"]


async def ordered_calls(count: int, concurrency: int, *, host: bool) -> tuple[list[int], list[int]]:
    """Run one reply of `count` calls of `step` (each a checkpoint long) through run() or a
    Host with `concurrency`: the order the handler ran them in, and the order their
    `local.tool_call` events were logged in."""
    ran: list[int] = []

    async def step(n: int) -> str:
        ran.append(n)
        await anyio.lowlevel.checkpoint()
        return str(n)

    reply = tool_response(*[("step", {"n": n}) for n in range(count)])
    chat = ScriptedChat([reply, text_response("done")])
    if host:
        async with Host(
            chat=chat, log=MemoryLog(), tools={"step": step}, tool_concurrency=concurrency
        ) as running:
            session_id = await running.start(ORDERED, "go")
            assert (await running.result(session_id, wait=30)).status == "idle"
            events = await running.events(session_id)
    else:
        result = await run(ORDERED, "go", chat, tools={"step": step}, tool_concurrency=concurrency)
        assert result.text == "done"
        events = list(result.events)
    logged = [e.event.input["n"] for e in events if isinstance(e.event, ToolCalled)]
    return ran, logged


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("host", [False, True])
def test_serial_tools_run_in_call_order(backend: str, host: bool) -> None:
    ran, logged = anyio.run(lambda: ordered_calls(4, 1, host=host), backend=backend)
    assert ran == logged == [0, 1, 2, 3]


@settings(max_examples=25, deadline=None)
@given(
    count=st.integers(1, 8),
    concurrency=st.integers(1, 9),
    host=st.booleans(),
    backend=st.sampled_from(BACKENDS),
)
def test_limited_tools_start_in_call_order(
    count: int, concurrency: int, host: bool, backend: str
) -> None:
    ran, logged = anyio.run(lambda: ordered_calls(count, concurrency, host=host), backend=backend)
    assert sorted(ran) == sorted(logged) == list(range(count))
    if concurrency == 1:
        assert ran == logged == list(range(count))
    elif concurrency < count:
        # Each later call starts when one before it is done.
        assert ran[:concurrency] == list(range(concurrency))


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [None, 1, 2, 3, 10])
async def test_run_each_runs_every_call_at_most_limit_at_a_time(limit: int | None) -> None:
    uses = [ToolUse(f"c{n}", "step", {"n": n}) for n in range(7)]
    started: list[str] = []
    running = 0
    most = 0

    async def func(use: ToolUse) -> None:
        nonlocal running, most
        started.append(use.id)
        running += 1
        most = max(most, running)
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        running -= 1

    await run_each(func, uses, limit=limit)
    assert sorted(started) == sorted(use.id for use in uses)
    assert most <= (limit or len(uses))
    if limit is not None and limit < len(uses):
        assert started == [use.id for use in uses]


def test_a_result_within_the_limit_is_kept_and_a_longer_one_is_cut_with_a_note() -> None:
    short = ToolResult("c1", "x" * 10)
    assert cut_result(short, 10) is short
    cut = cut_result(ToolResult("c1", "ab" * 10, is_error=True), 5)
    assert cut.text.startswith("ababa\n[turnkeeper: result cut: 15 of its 20 characters")
    assert "at most 5" in cut.text
    assert (cut.tool_use_id, cut.is_error) == ("c1", True)


@pytest.mark.anyio
@pytest.mark.parametrize("raises", [False, True])
async def test_run_tool_cuts_what_a_handler_gives_at_the_limit(raises: bool) -> None:
    async def huge(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        if raises:
            raise RuntimeError("y" * 300_000)
        return "y" * 300_000

    use = ToolUse("c1", "clock", {})
    ctx = ToolContext("s", "c1", "clock")
    result = await run_tool(huge, use, ctx)
    assert MAX_TOOL_RESULT_CHARS == 100_000
    assert result.is_error == raises
    assert len(result.text) < MAX_TOOL_RESULT_CHARS + 200
    assert "characters are left out (a result may have at most 100000)" in result.text
    kept = await run_tool(huge, use, ctx, max_chars=1_000_000)
    assert len(kept.text) >= 300_000
