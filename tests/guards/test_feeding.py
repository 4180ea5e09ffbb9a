"""Self-feeding: calls that feed a tool its own results are flagged, then stopped; calls
that are distinct and independent never are. Each session is live: run() with a
ScriptedChat whose model reads the last tool result, as a weak model does."""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, GuardConfig, SelfFeeding, ToolSpec
from turnkeeper.events import DirectiveInjected, Halted
from turnkeeper.guards import GuardView, self_feeding
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import RunResult, recheck, run
from turnkeeper.state import replay
from turnkeeper.tools import EXAMPLE_TOOLS

NUMBER = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
PAIR = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    "required": ["a", "b"],
}
SPEC = AgentSpec(
    tools=(
        ToolSpec("sqrt", "Square root", NUMBER),
        ToolSpec("add", "Sum", PAIR),
        ToolSpec("pages", "A page of results", {"type": "object"}),
        ToolSpec("lookup", "Look up a number", NUMBER),
    )
)
[CALCULATOR] = [
    tool for tool in EXAMPLE_TOOLS if isinstance(tool, tuple) and tool[0].name == "calculator"
]
CALC_SPEC = AgentSpec(tools=(CALCULATOR[0],))


async def sqrt(x: float) -> str:
    return str(math.sqrt(x))


async def add(a: float, b: float) -> str:
    return str(a + b)


async def pages(page: int) -> str:
    return msgspec.json.encode({"items": [page * 10, page * 10 + 1], "next": page + 1}).decode()


async def lookup(x: float) -> str:
    return str(x + 1000)


TOOLS: dict[str, Callable[..., Awaitable[Any]]] = {
    "sqrt": sqrt,
    "add": add,
    "pages": pages,
    "lookup": lookup,
}


def last_result(request: dict[str, Any]) -> str:
    return str(next(m["content"] for m in reversed(request["messages"]) if m["role"] == "tool"))


def feeding(
    calls: int, make: Callable[[str], tuple[str, dict[str, Any]]], first: tuple[str, dict[str, Any]]
) -> ScriptedChat:
    """A model making `first`, then `calls - 1` calls each made from the last result, then
    answering with the last result."""
    script: list[Any] = [tool_response(first)]
    script += [lambda request: tool_response(make(last_result(request)))] * (calls - 1)
    script.append(lambda request: text_response(f"The answer is {last_result(request)}"))
    return ScriptedChat(script)


WARN_THEN_HALT = GuardConfig(self_feeding=SelfFeeding(answer=False))
"""The guard without the answer after its stop (tests/guards/test_answer.py has that),
so that it warns first and its stop is a halt."""


def guard_events(result: RunResult) -> tuple[list[str], list[tuple[str, str]]]:
    directives = [
        e.event.text
        for e in result.events
        if isinstance(e.event, DirectiveInjected) and e.event.guard == "self_feeding"
    ]
    halts = [(e.event.guard, e.event.reason) for e in result.events if isinstance(e.event, Halted)]
    return directives, halts


def consistent(result: RunResult) -> None:
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


@pytest.mark.anyio
async def test_a_square_root_of_the_last_square_root_is_warned_then_stopped() -> None:
    chat = feeding(7, lambda last: ("sqrt", {"x": float(last)}), ("sqrt", {"x": 16}))
    result = await run(
        SPEC, "What is the square root of 16?", chat, tools=TOOLS, guards=WARN_THEN_HALT
    )
    directives, halts = guard_events(result)
    # sqrt(16), then 3 links allowed: the 3rd is over max_links=2 and warned, the 4th stops.
    assert result.turns == 5
    assert len(directives) == 1
    assert "feeding `sqrt` its own results" in directives[0]
    assert halts == [("self_feeding", "feeding_on_results")]
    assert result.terminal == "terminated"
    assert result.text is not None
    # The halt leads with what the chain's first call gave: the square root of 16.
    assert result.text.startswith("4.0\n\n")
    consistent(result)


@pytest.mark.anyio
async def test_an_expression_holding_the_last_result_feeds_on_it() -> None:
    chat = feeding(
        7,
        lambda last: ("calculator", {"expression": f"sqrt({last})"}),
        ("calculator", {"expression": "sqrt(16)"}),
    )
    result = await run(
        CALC_SPEC, "sqrt(16)?", chat, tools={"calculator": CALCULATOR[1]}, guards=WARN_THEN_HALT
    )
    directives, halts = guard_events(result)
    assert (len(directives), halts) == (1, [("self_feeding", "feeding_on_results")])
    assert result.text is not None
    assert result.text.startswith("4\n\n")
    consistent(result)


@pytest.mark.anyio
async def test_a_result_rounded_or_cut_by_the_model_still_feeds() -> None:
    chat = feeding(
        7, lambda last: ("sqrt", {"x": math.floor(float(last) * 1e4) / 1e4}), ("sqrt", {"x": 7})
    )
    result = await run(SPEC, "sqrt 7?", chat, tools=TOOLS, guards=WARN_THEN_HALT)
    assert guard_events(result)[1] == [("self_feeding", "feeding_on_results")]


@pytest.mark.anyio
async def test_a_sum_taking_each_next_number_from_the_request_is_left_alone() -> None:
    numbers = iter([3, 4, 5, 6, 7, 8])
    chat = feeding(
        7, lambda last: ("add", {"a": float(last), "b": next(numbers)}), ("add", {"a": 1, "b": 2})
    )
    result = await run(SPEC, "1+2+3+4+5+6+7+8?", chat, tools=TOOLS)
    assert guard_events(result) == ([], [])
    assert result.text == "The answer is 36.0"


@pytest.mark.anyio
async def test_paging_through_structured_results_is_left_alone() -> None:
    chat = feeding(
        7,
        lambda last: ("pages", {"page": msgspec.json.decode(last)["next"]}),
        ("pages", {"page": 1}),
    )
    result = await run(SPEC, "list everything", chat, tools=TOOLS)
    assert guard_events(result) == ([], [])


@pytest.mark.anyio
async def test_a_short_chain_is_left_alone() -> None:
    chat = feeding(3, lambda last: ("sqrt", {"x": float(last)}), ("sqrt", {"x": 256}))
    result = await run(SPEC, "sqrt(sqrt(sqrt(256)))?", chat, tools=TOOLS)
    assert guard_events(result) == ([], [])
    assert result.text == "The answer is 2.0"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("config", "turns", "warned", "stopped"),
    [
        (SelfFeeding(max_links=1, warnings=0, answer=False), 3, 0, True),
        (SelfFeeding(max_links=2, warnings=2, answer=False), 6, 2, True),
        (SelfFeeding(max_links=6, warnings=1), 8, 0, False),
        (None, 8, 0, False),
    ],
)
async def test_the_guard_is_configurable_and_can_be_turned_off(
    config: SelfFeeding | None, turns: int, warned: int, stopped: bool
) -> None:
    chat = feeding(7, lambda last: ("sqrt", {"x": float(last)}), ("sqrt", {"x": 16}))
    guards = GuardConfig(self_feeding=config)
    result = await run(SPEC, "sqrt 16?", chat, tools=TOOLS, guards=guards)
    directives, halts = guard_events(result)
    assert (result.turns, len(directives), bool(halts)) == (turns, warned, stopped)
    consistent(result)


@pytest.mark.anyio
async def test_a_chain_broken_by_another_call_starts_again() -> None:
    script: list[Any] = [tool_response(("sqrt", {"x": 16}))]
    for step in range(8):
        if step == 3:
            script.append(tool_response(("lookup", {"x": 1})))
        elif step == 4:
            script.append(tool_response(("sqrt", {"x": 81})))
        else:
            script.append(
                lambda request: tool_response(("sqrt", {"x": float(last_result(request))}))
            )
    script.append(text_response("done"))
    result = await run(SPEC, "go", ScriptedChat(script), tools=TOOLS, guards=WARN_THEN_HALT)
    directives, halts = guard_events(result)
    # Each chain reaches 3 links, one over the limit: each is warned, neither stopped.
    assert halts == []
    assert len(directives) == 2
    assert result.text == "done"


# Distinct and independent calls: the DESIGN invariant.

independent = st.lists(
    st.tuples(st.sampled_from(["sqrt", "lookup", "add"]), st.integers(0, 99), st.integers(0, 99)),
    min_size=1,
    max_size=20,
    unique_by=lambda call: (call[0], call[1], call[2] if call[0] == "add" else 0),
)


@settings(max_examples=40, deadline=None)
@given(calls=independent, per_reply=st.integers(1, 3), backend=st.sampled_from(["asyncio", "trio"]))
def test_calls_that_are_distinct_and_independent_are_never_stopped(
    calls: list[tuple[str, int, int]], per_reply: int, backend: str
) -> None:
    # No argument (100..199 for sqrt and lookup, 2000..2099 for add) is ever a result
    # (10..15, 1100..1199, 4000..4198), as written, rounded or cut.
    def arguments(name: str, x: int, b: int) -> dict[str, Any]:
        if name == "add":
            return {"a": x + 2000, "b": b + 2000}
        return {"x": x + 100}

    replies = [calls[i : i + per_reply] for i in range(0, len(calls), per_reply)]
    script: list[Any] = [
        tool_response(*[(name, arguments(name, x, b)) for name, x, b in reply]) for reply in replies
    ]
    script.append(text_response("done"))

    async def main() -> RunResult:
        return await run(SPEC, "go", ScriptedChat(script), tools=TOOLS, max_turns=100)

    result = anyio.run(main, backend=backend)
    assert result.text == "done"
    assert guard_events(result) == ([], [])
    assert not any(isinstance(e.event, Halted) for e in result.events)


def test_the_verdict_depends_on_the_view_alone() -> None:
    chat = feeding(7, lambda last: ("sqrt", {"x": float(last)}), ("sqrt", {"x": 16}))
    views: list[GuardView] = []

    def recording(view: GuardView) -> Any:
        from turnkeeper.guards import default_guards

        if view.phase == "before_call":
            views.append(view)
        return default_guards(view)

    result = anyio.run(
        lambda: run(SPEC, "sqrt 16?", chat, tools=TOOLS, guard=recording, guards=WARN_THEN_HALT)
    )
    assert guard_events(result)[1] == [("self_feeding", "feeding_on_results")]
    verdicts = [self_feeding(view) for view in views]
    assert [self_feeding(msgspec.structs.replace(view)) for view in views] == verdicts
    assert [v.halt is not None for v in verdicts][-1]
    assert len(list(itertools.takewhile(lambda v: v.halt is None, verdicts))) == len(verdicts) - 1


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(10**400), 10**400)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["sqrt(4)", "1e999", "1.41", "-0.5", "x1y2"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
arguments = st.dictionaries(st.sampled_from(["x", "y", "q"]), json_values, max_size=3)
results = st.text(max_size=30) | st.sampled_from(
    ["4", "1e999", "-2.5", '{"r": 3}', '{"r": 1e999}', '{"r": ' + "9" * 400 + "}", "NaN", "inf"]
)


@settings(max_examples=300, deadline=None)
@given(before=arguments, after=arguments, result=results)
def test_any_arguments_and_result_are_judged_without_error(
    before: dict[str, Any], after: dict[str, Any], result: str
) -> None:
    from turnkeeper.guards._feeding import _feeds, _may_take, _value

    value = _value(result)
    if value is None:
        return
    feeds = _feeds(before, value, after)
    assert feeds in (True, False)
    # The cheap test never turns away a call that feeds.
    assert _may_take(after, value) or not feeds
