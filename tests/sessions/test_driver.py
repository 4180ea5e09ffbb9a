"""The model-call driver: a call's outcome, and the events it logs, answered or failed."""

from __future__ import annotations

import pytest

from turnkeeper.core import AgentSpec, ChatError, ToolSpec
from turnkeeper.events import ChatFailed, ChatRetried, ModelResponded
from turnkeeper.guards import default_guards
from turnkeeper.providers import ScriptedChat, text_response, tool_response, with_retry
from turnkeeper.sessions import Kickoff, begin_poll, end_poll, open_session
from turnkeeper.sessions._driver import Called, answer, call_model
from turnkeeper.state import SessionState

SPEC = AgentSpec(system_prompt="You help.", tools=(ToolSpec("search"),), model="tiny")


def begun() -> tuple[SessionState, SessionState]:
    """A fresh session, and the same awaiting the model's answer to its prompt."""
    state = open_session(SPEC, session_id="s1")
    _, awaiting, request = begin_poll(state, Kickoff("Go."), now=1.0)
    assert request is not None
    return state, awaiting


async def no_sleep(delay: float) -> None:
    pass


@pytest.mark.anyio
async def test_a_call_gives_the_response_and_what_the_backend_reported() -> None:
    flaky = ScriptedChat([ChatError("HTTP 503", transient=True), text_response("Hi.")])
    called = await call_model(with_retry(flaky, sleep=no_sleep), {"messages": []})
    assert called.failure is None
    assert called.response == text_response("Hi.")
    assert [type(event) for event in called.reported] == [ChatRetried]


@pytest.mark.anyio
async def test_a_failed_call_is_its_outcome_not_raised() -> None:
    called = await call_model(ScriptedChat([ChatError("HTTP 400", transient=False)]), {})
    assert called.response is None
    assert called.failure is not None
    assert called.failure.message == "HTTP 400"


def test_an_answer_is_what_end_poll_makes_of_the_response() -> None:
    _, awaiting = begun()
    response = tool_response(("search", {"q": "x"}))
    ticks = iter([5.0])
    answered = answer(
        Called(response, None, []), awaiting, guard=default_guards, clock=lambda: next(ticks)
    )
    assert answered.failure is None
    assert (answered.events, answered.state) == end_poll(awaiting, response, now=5.0)
    assert isinstance(answered.events[0].event, ModelResponded)


def test_a_failure_logs_the_reports_then_the_error_and_moves_only_the_seq() -> None:
    _, awaiting = begun()
    retried = ChatRetried(attempt=1, delay=0.5, error="HTTP 503", status=503)
    error = ChatError("HTTP 500", transient=True, status=500)
    answered = answer(
        Called(None, error, [retried]), awaiting, guard=default_guards, clock=lambda: 7.0
    )
    assert answered.failure is error
    assert [envelope.event for envelope in answered.events] == [
        retried,
        ChatFailed(error="HTTP 500", transient=True, status=500),
    ]
    assert [envelope.seq for envelope in answered.events] == [awaiting.seq + 1, awaiting.seq + 2]
    assert answered.state.seq == awaiting.seq + 2
    assert answered.state.history == awaiting.history
    assert answered.state.in_poll


def test_a_malformed_response_is_a_failure_that_keeps_the_response() -> None:
    _, awaiting = begun()
    answered = answer(
        Called({"choices": []}, None, []), awaiting, guard=default_guards, clock=lambda: 7.0
    )
    assert answered.failure is not None
    assert answered.failure.message == "malformed response: no choices"
    (failed,) = [envelope.event for envelope in answered.events]
    assert failed == ChatFailed(
        error="malformed response: no choices", transient=False, response={"choices": []}
    )


def test_a_failure_is_numbered_after_the_state_it_is_told_to_follow() -> None:
    state, awaiting = begun()
    error = ChatError("HTTP 500", transient=True)
    answered = answer(
        Called(None, error, []),
        awaiting,
        guard=default_guards,
        clock=lambda: 7.0,
        failed_after=state,
    )
    # The fresh session's opening event comes first, as the poll's input is not logged.
    assert [envelope.seq for envelope in answered.events] == [1, 2]
    assert answered.events[0].type == "local.session_opened"
    assert answered.state.seq == 2
