"""normalize: the outcome of one poll read from its events."""

from __future__ import annotations

import pytest

from turnkeeper.core import AgentSpec, GuardConfig, ToolSpec
from turnkeeper.events import DirectiveInjected, Envelope, Halted
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Kickoff, normalize, open_session, poll_turn

pytestmark = pytest.mark.anyio

SPEC = AgentSpec(tools=(ToolSpec("f"),))


async def one_poll(
    response: dict[str, object], guards: GuardConfig | None = None
) -> tuple[Envelope, ...]:
    state = open_session(SPEC, guards=guards)
    events, _ = await poll_turn(state, Kickoff("go"), ScriptedChat([response]))
    return events


@pytest.mark.parametrize(
    ("finish_reason", "terminal", "stop_reason"),
    [
        ("stop", "end_turn", "end_turn"),
        ("length", "terminated", "length"),
        ("content_filter", "terminated", "content_filter"),
    ],
)
async def test_finish_reason_decides_a_text_turn(
    finish_reason: str, terminal: str, stop_reason: str
) -> None:
    # With the repair guard off: it re-prompts a reply cut off by the token limit.
    response = text_response("hi", finish_reason=finish_reason)
    turn = normalize(await one_poll(response, GuardConfig(repair=None)))
    assert (turn.terminal, turn.stop_reason, turn.text) == (terminal, stop_reason, "hi")


async def test_a_text_turn_a_guard_answers_requires_action() -> None:
    events = await one_poll(text_response("hi", finish_reason="length"))
    assert [e.event.guard for e in events if isinstance(e.event, DirectiveInjected)] == ["repair"]
    turn = normalize(events)
    assert (turn.terminal, turn.stop_reason, turn.tool_uses) == ("requires_action", "tool_use", ())


async def test_missing_finish_reason_is_terminated_unknown() -> None:
    response = text_response("hi")
    del response["choices"][0]["finish_reason"]
    turn = normalize(await one_poll(response))
    assert (turn.terminal, turn.stop_reason) == ("terminated", "unknown")


async def test_tool_calls_win_over_a_stop_finish_reason() -> None:
    response = tool_response(("f", {}))
    response["choices"][0]["finish_reason"] = "stop"
    turn = normalize(await one_poll(response))
    assert turn.terminal == "requires_action"
    assert [u.name for u in turn.tool_uses] == ["f"]


async def test_usage_and_events_are_reported() -> None:
    events = await one_poll(text_response("hi", usage=(12, 3)))
    turn = normalize(events)
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens) == (12, 3)
    assert turn.events == events


def test_no_events_or_no_response_is_terminated() -> None:
    turn = normalize([])
    assert (turn.terminal, turn.stop_reason, turn.tool_uses) == ("terminated", "no_response", ())


def test_a_halt_is_terminated_with_its_message() -> None:
    halted = Envelope("s", 3, 0.0, Halted(guard="budget", reason="budget_exceeded", message="m"))
    turn = normalize([halted])
    assert (turn.terminal, turn.stop_reason, turn.text) == ("terminated", "budget_exceeded", "m")
