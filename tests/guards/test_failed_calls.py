"""A call whose result was an error is not a duplicate: its retry runs, the consecutive
errors corrective counts it, and loop detection judges it by what it returns. Each
session is live: run() with a ScriptedChat and in-process tools."""

from __future__ import annotations

from typing import Any

import pytest

from turnkeeper.core import AgentSpec, GuardConfig, ToolSpec
from turnkeeper.events import DirectiveInjected, DuplicateToolCall, Halted, ToolCalled
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import RunResult, recheck, run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

SPEC = AgentSpec(tools=(ToolSpec("fetch"), ToolSpec("other")))


def directives(result: RunResult) -> list[tuple[str, str]]:
    return [
        (e.event.guard, e.event.text)
        for e in result.events
        if isinstance(e.event, DirectiveInjected)
    ]


def ran(result: RunResult) -> list[dict[str, Any]]:
    return [e.event.input for e in result.events if isinstance(e.event, ToolCalled)]


def consistent(result: RunResult) -> None:
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_a_call_that_failed_runs_again_when_retried() -> None:
    answers = iter(["timed out", None])

    async def fetch(url: str) -> str:
        error = next(answers)
        if error is not None:
            raise TimeoutError(error)
        return "the page"

    chat = ScriptedChat(
        [
            tool_response(("fetch", {"url": "a"})),
            tool_response(("fetch", {"url": "a"})),
            text_response("It says: the page"),
        ]
    )
    result = await run(SPEC, "Read a", chat, tools={"fetch": fetch})
    assert result.text == "It says: the page"
    assert ran(result) == [{"url": "a"}, {"url": "a"}]
    assert not any(isinstance(e.event, DuplicateToolCall) for e in result.events)
    assert directives(result) == []
    consistent(result)


async def test_a_retried_call_failing_again_gets_the_corrective_then_the_loop_stops_it() -> None:
    async def fetch(url: str) -> str:
        raise PermissionError("forbidden")

    chat = ScriptedChat([tool_response(("fetch", {"url": "a"}))] * 3 + [text_response("x")])
    result = await run(SPEC, "Read a", chat, tools={"fetch": fetch})
    assert ran(result) == [{"url": "a"}] * 3
    said = directives(result)
    assert [guard for guard, _ in said] == ["loop", "consecutive_errors"]
    assert "`fetch` has failed 2 times in a row" in said[1][1]
    [halt] = [e.event for e in result.events if isinstance(e.event, Halted)]
    assert (halt.guard, halt.reason) == ("loop", "going_in_circles")
    assert result.turns == 3
    consistent(result)


async def test_the_consecutive_errors_corrective_counts_retries_with_loop_detection_off() -> None:
    async def fetch(url: str) -> str:
        raise PermissionError("forbidden")

    chat = ScriptedChat([tool_response(("fetch", {"url": "a"}))] * 2 + [text_response("failed")])
    config = GuardConfig(loop=None)
    result = await run(SPEC, "Read a", chat, tools={"fetch": fetch}, guards=config)
    assert ran(result) == [{"url": "a"}] * 2
    assert [guard for guard, _ in directives(result)] == ["consecutive_errors"]
    assert result.text == "failed"
    consistent(result)


async def test_a_call_that_succeeded_is_still_a_duplicate() -> None:
    calls = 0

    async def fetch(url: str) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TimeoutError("timed out")
        return "the page"

    chat = ScriptedChat(
        [
            tool_response(("fetch", {"url": "a"})),
            tool_response(("fetch", {"url": "a"})),
            tool_response(("fetch", {"url": "a"})),
            text_response("done"),
        ]
    )
    result = await run(SPEC, "Read a", chat, tools={"fetch": fetch})
    assert ran(result) == [{"url": "a"}] * 2
    [duplicate] = [e.event for e in result.events if isinstance(e.event, DuplicateToolCall)]
    assert duplicate.name == "fetch"
    consistent(result)


async def test_a_repeat_within_one_reply_of_a_failing_call_is_a_duplicate() -> None:
    async def fetch(url: str) -> str:
        raise TimeoutError("timed out")

    chat = ScriptedChat(
        [tool_response(("fetch", {"url": "a"}), ("fetch", {"url": "a"})), text_response("no")]
    )
    result = await run(SPEC, "Read a", chat, tools={"fetch": fetch})
    assert ran(result) == [{"url": "a"}]
    assert sum(isinstance(e.event, DuplicateToolCall) for e in result.events) == 1
    consistent(result)
