"""The repair guard in live sessions: a reply cut off by the token limit, degenerate, or
holding a call the parser marks unreadable is re-prompted once, never taken as the
answer; a second bad reply in a row ends the run with an apology and a halt event."""

from __future__ import annotations

import pytest

from turnkeeper.core import AgentSpec, GuardConfig, TerminalTool, ToolSpec
from turnkeeper.events import DirectiveInjected, Halted
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import InlineTools, ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, RunResult, recheck, run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

FINISH = ToolSpec(
    "finish",
    "Give the answer",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
WEATHER = ToolSpec(
    "weather",
    "The weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
SPEC = AgentSpec(tools=(WEATHER, FINISH), terminal_tool="finish")
RUNAWAY = '<tool_call>{"name": "finish", "arguments": {"answer": "' + "the weather " * 60
DEGENERATE = "I will check the weather. " * 12


async def weather(city: str) -> str:
    return f"{city}: sunny"


def repairs(result: RunResult) -> list[str]:
    return [
        e.event.text
        for e in result.events
        if isinstance(e.event, DirectiveInjected) and e.event.guard == "repair"
    ]


def halts(result: RunResult) -> list[tuple[str, str]]:
    return [(e.event.guard, e.event.reason) for e in result.events if isinstance(e.event, Halted)]


def consistent(result: RunResult) -> None:
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_a_reply_cut_off_by_the_token_limit_is_re_prompted_not_the_answer() -> None:
    chat = ScriptedChat(
        [text_response("The weather in Paris is", finish_reason="length"), text_response("Sunny.")]
    )
    result = await run(SPEC, "Weather in Paris?", chat, tools={"weather": weather})
    assert (result.terminal, result.stop_reason, result.text) == ("end_turn", "end_turn", "Sunny.")
    [directive] = repairs(result)
    assert "cut off by the token limit" in directive
    assert chat.requests[1]["messages"][-1] == {"role": "user", "content": directive}
    consistent(result)


async def test_a_runaway_inline_call_is_repaired_like_a_bad_call() -> None:
    # The case: the model began a `finish` call and repeated one phrase until the
    # token limit cut it; the reply was marked unreadable.
    chat = InlineTools(
        ScriptedChat(
            [
                text_response(RUNAWAY, finish_reason="length"),
                text_response('<tool_call>{"name": "finish", "arguments": {"answer": "Sunny"}}'),
            ]
        )
    )
    result = await run(SPEC, "Weather in Paris?", chat, tools={"weather": weather})
    assert (result.terminal, result.stop_reason, result.result) == (
        "end_turn",
        "terminal_tool",
        {"answer": "Sunny"},
    )
    assert len(repairs(result)) == 1
    consistent(result)


async def test_an_unreadable_call_in_a_finished_reply_is_not_the_answer() -> None:
    unreadable = '<tool_call>\n{"name": "weather", "arguments": {"city": "Par\nis"}}\n</tool_call>'
    chat = InlineTools(
        ScriptedChat(
            [
                text_response(unreadable),
                text_response('<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}'),
                text_response("Paris: sunny."),
            ]
        )
    )
    result = await run(SPEC, "Weather in Paris?", chat, tools={"weather": weather})
    assert result.text == "Paris: sunny."
    [directive] = repairs(result)
    assert "neither a readable tool call nor an answer" in directive
    consistent(result)


async def test_a_degenerate_reply_is_re_prompted() -> None:
    chat = ScriptedChat([text_response(DEGENERATE), text_response("Paris is sunny.")])
    result = await run(SPEC, "Weather in Paris?", chat, tools={"weather": weather})
    assert result.text == "Paris is sunny."
    [directive] = repairs(result)
    assert "repeats one phrase over and over" in directive
    consistent(result)


async def test_a_second_bad_reply_in_a_row_halts_with_an_apology() -> None:
    chat = ScriptedChat(
        [text_response("Paris is", finish_reason="length"), text_response(DEGENERATE)]
    )
    result = await run(SPEC, "Weather in Paris?", chat, tools={"weather": weather})
    assert halts(result) == [("repair", "bad_reply")]
    assert result.terminal == "terminated"
    assert result.text is not None
    assert result.text.startswith("I'm sorry: I could not give a usable reply (it repeats")
    assert result.turns == 2
    consistent(result)


async def test_a_bad_call_then_an_unreadable_reply_halts_as_bad_tool_calls() -> None:
    chat = InlineTools(
        ScriptedChat(
            [
                text_response('<tool_call>{"name": "weather", "arguments": {}}'),
                text_response(RUNAWAY, finish_reason="length"),
            ]
        )
    )
    result = await run(SPEC, "Weather in Paris?", chat, tools={"weather": weather})
    assert halts(result) == [("repair", "bad_tool_calls")]
    assert repairs(result) == []
    consistent(result)


async def test_a_good_reply_between_bad_ones_starts_the_count_again() -> None:
    cut = text_response("Paris", finish_reason="length")
    chat = ScriptedChat(
        [cut, tool_response(("weather", {"city": "Paris"})), cut, text_response("Sunny.")]
    )
    result = await run(SPEC, "Weather in Paris?", chat, tools={"weather": weather})
    assert result.text == "Sunny."
    assert len(repairs(result)) == 2
    assert halts(result) == []
    consistent(result)


async def test_with_repair_off_a_cut_off_reply_ends_the_run_as_before() -> None:
    chat = ScriptedChat([text_response("The weather in Paris is", finish_reason="length")])
    result = await run(
        SPEC, "Weather in Paris?", chat, tools={"weather": weather}, guards=GuardConfig(repair=None)
    )
    assert (result.terminal, result.stop_reason, result.turns) == ("terminated", "length", 1)
    assert repairs(result) == []
    consistent(result)


async def test_a_required_terminal_tool_leaves_a_bad_reply_to_repair() -> None:
    config = GuardConfig(terminal=TerminalTool(required=True, max_reprompts=1))
    chat = ScriptedChat(
        [
            text_response(DEGENERATE),
            text_response("Sunny."),
            tool_response(("finish", {"answer": "Sunny"})),
        ]
    )
    result = await run(SPEC, "Weather?", chat, tools={"weather": weather}, guards=config)
    assert result.result == {"answer": "Sunny"}
    guards = [e.event.guard for e in result.events if isinstance(e.event, DirectiveInjected)]
    assert guards == ["repair", "terminal"]
    consistent(result)


async def test_a_host_re_prompts_a_cut_off_reply() -> None:
    chat = ScriptedChat(
        [text_response("The weather in Paris is", finish_reason="length"), text_response("Sunny.")]
    )
    async with Host(chat=chat, log=MemoryLog(), tools={"weather": weather}) as host:
        session_id = await host.start(SPEC, "Weather in Paris?")
        info = await host.result(session_id, wait=30)
        events = await host.events(session_id)
    assert (info.status, info.text) == ("idle", "Sunny.")
    assert [e.event.guard for e in events if isinstance(e.event, DirectiveInjected)] == ["repair"]
    assert replay(events).status == "idle"
    assert recheck(events) is None
