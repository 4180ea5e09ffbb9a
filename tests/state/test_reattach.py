"""A session reattached to a transcript remembers its last episode as a live one does: the
calls seen, the answers loop detection compares and the error counts. Each transcript is
one a run left behind (its model failing after a tool step), reattached with
run(history=...)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from turnkeeper.core import AgentSpec, ChatError, GuardConfig, LoopDetection, ToolSpec, call_key
from turnkeeper.events import DirectiveInjected, DuplicateToolCall
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import RunResult, open_session, recheck, run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

SPEC = AgentSpec(
    system_prompt="Use the tools.",
    tools=(ToolSpec("search"), ToolSpec("status", repeatable=True), ToolSpec("pay")),
)
DOWN = ChatError("HTTP 400: bad request", transient=False, status=400)


class Tools:
    """Tools that count their runs: search finds, status says pending, pay fails."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    async def search(self, q: str) -> str:
        self.runs.append("search")
        return f"found {q}"

    async def status(self) -> str:
        self.runs.append("status")
        return "pending"

    async def pay(self, amount: int) -> str:
        self.runs.append("pay")
        raise ValueError("card declined")

    def mapping(self) -> dict[str, Any]:
        return {"search": self.search, "status": self.status, "pay": self.pay}


async def left_behind(*calls: tuple[str, dict[str, Any]], prompt: str = "go") -> RunResult:
    """The run of `prompt` whose model makes `calls`, one reply each, then fails."""
    chat = ScriptedChat([*(tool_response(call) for call in calls), DOWN])
    result = await run(SPEC, prompt, chat, tools=Tools().mapping())
    assert result.stop_reason == "chat_error"
    assert result.transcript[-1]["role"] == "tool"
    return result


def consistent(result: RunResult) -> None:
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_a_repeat_of_the_transcripts_last_call_is_self_answered() -> None:
    before = await left_behind(("search", {"q": "lamps"}))
    tools = Tools()
    chat = ScriptedChat([tool_response(("search", {"q": "lamps"})), text_response("found lamps")])
    result = await run(SPEC, None, chat, tools=tools.mapping(), history=before.transcript)
    assert tools.runs == []
    [duplicate] = [e.event for e in result.events if isinstance(e.event, DuplicateToolCall)]
    assert (duplicate.name, duplicate.arguments) == ("search", '{"q":"lamps"}')
    assert result.text == "found lamps"
    consistent(result)


async def test_the_transcripts_last_failure_counts_toward_the_consecutive_errors() -> None:
    before = await left_behind(("pay", {"amount": 5}))
    tools = Tools()
    chat = ScriptedChat([tool_response(("pay", {"amount": 5})), text_response("declined")])
    result = await run(SPEC, None, chat, tools=tools.mapping(), history=before.transcript)
    assert tools.runs == ["pay"]
    texts = [
        e.event.text
        for e in result.events
        if isinstance(e.event, DirectiveInjected) and e.event.guard == "consecutive_errors"
    ]
    assert len(texts) == 1
    assert "`pay` has failed 2 times in a row" in texts[0]
    consistent(result)


async def test_a_repeatable_tools_remembered_answer_is_compared() -> None:
    before = await left_behind(("status", {}))
    tools = Tools()
    chat = ScriptedChat([tool_response(("status", {})), text_response("still pending")])
    # The loop guard warning rather than stopping for an answer.
    warn = GuardConfig(loop=LoopDetection(answer=False))
    result = await run(
        SPEC, None, chat, tools=tools.mapping(), history=before.transcript, guards=warn
    )
    assert tools.runs == ["status"]
    guards = [e.event.guard for e in result.events if isinstance(e.event, DirectiveInjected)]
    assert guards == ["loop"]
    consistent(result)


async def test_only_the_transcripts_last_episode_is_remembered() -> None:
    first = await run(
        SPEC,
        "find lamps",
        ScriptedChat([tool_response(("search", {"q": "lamps"})), text_response("found")]),
        tools=Tools().mapping(),
    )
    chat = ScriptedChat([tool_response(("pay", {"amount": 5})), DOWN])
    second = await run(SPEC, "pay", chat, tools=Tools().mapping(), history=first.transcript)
    state = open_session(SPEC, history=second.transcript)
    assert state.seen == frozenset()
    assert state.error_counts == {"pay": 1}
    assert state.answers == {call_key("pay", {"amount": 5}): second.transcript[-1]["content"]}
    assert state.last_failure == "ValueError: card declined"


async def test_the_reattached_state_is_what_the_live_one_was() -> None:
    before = await left_behind(("search", {"q": "a"}), ("status", {}), ("pay", {"amount": 1}))
    live = before.state
    reattached = open_session(SPEC, history=before.transcript)
    for field in ("seen", "error_counts", "answers", "last_failure"):
        assert getattr(reattached, field) == getattr(live, field), field
    assert reattached.resume


async def test_pending_calls_of_the_transcript_are_seen() -> None:
    chat = ScriptedChat([tool_response(("search", {"q": "a"}))])
    stopped = await run(SPEC, "go", chat)
    assert stopped.terminal == "requires_action"
    state = open_session(SPEC, history=stopped.transcript)
    assert state.seen == {call_key("search", {"q": "a"})}
    assert state.status == "requires_action"


async def test_a_call_the_transcript_never_ran_is_not_seen() -> None:
    # A second bad reply in a row halts the run before its calls run: they are skipped.
    chat = ScriptedChat(
        [
            tool_response(("pay", '{"amount": ')),
            tool_response(("pay", "{oops"), ("search", {"q": "a"})),
        ]
    )
    halted = await run(SPEC, "go", chat, tools=Tools().mapping())
    assert halted.stop_reason == "bad_tool_calls"
    assert json.loads(halted.transcript[-1]["content"])["skipped"] is True
    state = open_session(SPEC, history=halted.transcript)
    assert call_key("search", {"q": "a"}) not in state.seen
