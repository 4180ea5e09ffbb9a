"""Answer after a stop: a guard's stop of an episode with tool results becomes one last
model call with tools withdrawn, whose reply is the answer; through poll_turn, run() and
a Host, replayed and rechecked exactly."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sessions.host_worker import check_answered, settle
from turnkeeper.core import (
    AgentSpec,
    ChatError,
    GuardConfig,
    LoopDetection,
    MaxTurns,
    TerminalTool,
    ToolResult,
    ToolSpec,
)
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    Envelope,
    Halted,
    ModelResponded,
    TerminalToolCalled,
)
from turnkeeper.guards import (
    Halt,
    answer_request,
    answers_after,
    episode_results,
    grounded,
    with_last_result,
)
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import (
    Host,
    Kickoff,
    Resume,
    UserMessage,
    begin_poll,
    normalize,
    open_session,
    poll_turn,
    recheck,
    run,
)
from turnkeeper.state import replay

ADD = ToolSpec(
    "add",
    "Add two numbers",
    {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)
FINISH = ToolSpec(
    "finish",
    "Give the answer",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
SPEC = AgentSpec(system_prompt="Use the tools.", tools=(ADD,))
TERMINAL_SPEC = AgentSpec(
    system_prompt="Use the tools.", tools=(ADD, FINISH), terminal_tool="finish"
)
OUTCOMES = (Halted, AnsweredAfterStop, TerminalToolCalled)


async def add(a: float, b: float) -> str:
    return str(a + b)


async def fail(a: float, b: float) -> str:
    raise ValueError("the adder is broken")


def withdrawn(request: dict[str, Any]) -> bool:
    return request.get("tool_choice") == "none"


def looping(answer: str | None = "1 + 1 = 2") -> Any:
    """A model that calls add(1, 1) for ever, and answers `answer` once tools are withdrawn
    (None: calls it then too)."""
    requests: list[dict[str, Any]] = []

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        requests.append(request)
        if withdrawn(request) and answer is not None:
            return text_response(answer)
        return tool_response(("add", {"a": 1, "b": 1}, f"call_{len(requests)}"))

    chat.requests = requests  # type: ignore[attr-defined]
    return chat


def events_of(result: Any) -> list[Any]:
    return [envelope.event for envelope in result.events]


def check_exact(events: tuple[Envelope, ...] | list[Envelope], state: Any) -> None:
    assert replay(list(events)) == state
    assert recheck(list(events)) is None


pytestmark = pytest.mark.anyio


async def test_going_in_circles_ends_with_an_answer_from_the_results() -> None:
    chat = looping()
    result = await run(SPEC, "What is 1 + 1?", chat, tools={"add": add})
    assert (result.terminal, result.stop_reason, result.text) == (
        "end_turn",
        "end_turn",
        "1 + 1 = 2",
    )
    # The repeat is not warned of first: add(1, 1), its repeat, then the answer.
    assert result.turns == 3
    events = events_of(result)
    asked = [event for event in events if isinstance(event, AnswerRequested)]
    assert [(event.guard, event.reason) for event in asked] == [("loop", "going_in_circles")]
    assert isinstance(events[-1], AnsweredAfterStop)
    assert (events[-1].guard, events[-1].reason) == ("loop", "going_in_circles")
    assert isinstance(events[-2], ModelResponded)
    assert not any(isinstance(event, Halted) for event in events)
    last = chat.requests[-1]
    assert withdrawn(last)
    assert not any(withdrawn(r) for r in chat.requests[:-1])
    directive = last["messages"][-1]
    assert directive["role"] == "user"
    assert "What is 1 + 1?" in directive["content"]
    assert "2" in directive["content"]
    assert (result.state.status, result.state.answering) == ("idle", None)
    check_exact(result.events, result.state)


async def test_the_answer_setting_off_halts_as_before() -> None:
    chat = looping()
    guards = GuardConfig(loop=LoopDetection(answer=False))
    result = await run(SPEC, "What is 1 + 1?", chat, tools={"add": add}, guards=guards)
    assert (result.terminal, result.stop_reason, result.turns) == (
        "terminated",
        "going_in_circles",
        3,
    )
    assert not any(withdrawn(request) for request in chat.requests)
    assert not any(isinstance(event, AnswerRequested) for event in events_of(result))
    check_exact(result.events, result.state)


async def test_a_reply_without_text_halts_with_the_gist() -> None:
    result = await run(SPEC, "What is 1 + 1?", looping(None), tools={"add": add})
    assert (result.terminal, result.stop_reason, result.turns) == (
        "terminated",
        "going_in_circles",
        3,
    )
    assert result.text is not None
    assert result.text.startswith("2")
    halted = events_of(result)[-1]
    assert isinstance(halted, Halted)
    assert halted.guard == "loop"
    # The call of the reply to the withdrawn tools was not run: answered as not run.
    assert result.state.pending == ()
    assert result.transcript[-1]["role"] == "tool"
    assert "not run" in result.transcript[-1]["content"]
    check_exact(result.events, result.state)


async def test_a_failed_answer_call_halts_with_the_stop_and_its_gist() -> None:
    inner = looping()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        if withdrawn(request):
            raise ChatError("HTTP 400", transient=False, status=400)
        response: dict[str, Any] = await inner(request)
        return response

    result = await run(SPEC, "What is 1 + 1?", chat, tools={"add": add})
    assert (result.terminal, result.stop_reason) == ("terminated", "going_in_circles")
    assert result.text is not None
    assert result.text.startswith("2")
    check_exact(result.events, result.state)


async def test_without_tool_results_the_stop_is_a_halt() -> None:
    # Every call fails: there is nothing to answer from, so max_turns halts as before.
    chat = looping()
    result = await run(SPEC, "What is 1 + 1?", chat, tools={"add": fail}, max_turns=2)
    assert (result.terminal, result.stop_reason, result.turns) == (
        "terminated",
        "max_turns_exceeded",
        2,
    )
    assert not any(withdrawn(request) for request in chat.requests)


async def test_max_turns_makes_the_last_allowed_poll_without_tools() -> None:
    count = iter(range(100))
    requests: list[dict[str, Any]] = []

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        requests.append(request)
        if withdrawn(request):
            return text_response("The sums were 1000 and 1001.")
        return tool_response(("add", {"a": next(count), "b": 1000}))

    result = await run(SPEC, "Add things", chat, tools={"add": add}, max_turns=3)
    assert (result.terminal, result.text) == ("end_turn", "The sums were 1000 and 1001.")
    assert result.turns == len(requests) == 3
    assert [withdrawn(request) for request in requests] == [False, False, True]
    assert events_of(result)[-1] == AnsweredAfterStop(
        guard="max_turns", reason="max_turns_exceeded"
    )
    check_exact(result.events, result.state)
    # Turned off, the last poll is the final-turn directive's, with tools, and the run halts.
    off = GuardConfig(max_turns=MaxTurns(answer=False))
    count = iter(range(100))
    requests.clear()
    result = await run(SPEC, "Add things", chat, tools={"add": add}, max_turns=3, guards=off)
    assert (result.stop_reason, result.turns) == ("max_turns_exceeded", 3)
    assert not any(withdrawn(request) for request in requests)


def no_terminal_script() -> ScriptedChat:
    return ScriptedChat(
        [
            tool_response(("add", {"a": 2, "b": 3})),
            text_response("five"),
            text_response("2 + 3 = 5"),
        ]
    )


NO_REPROMPTS = GuardConfig(terminal=TerminalTool(required=True, max_reprompts=0))


async def test_a_stop_after_the_response_asks_for_the_answer_in_the_next_call() -> None:
    chat = no_terminal_script()
    result = await run(TERMINAL_SPEC, "2 + 3?", chat, tools={"add": add}, guards=NO_REPROMPTS)
    assert (result.terminal, result.text, result.turns) == ("end_turn", "2 + 3 = 5", 3)
    assert [withdrawn(request) for request in chat.requests] == [False, False, True]
    types = [type(event).__name__ for event in events_of(result)]
    assert types[-4:] == [
        "ModelResponded",
        "AnswerRequested",
        "ModelResponded",
        "AnsweredAfterStop",
    ]
    check_exact(result.events, result.state)


async def test_poll_turn_leaves_the_answer_call_in_flight_for_resume() -> None:
    chat = no_terminal_script()
    state = open_session(TERMINAL_SPEC, guards=NO_REPROMPTS)
    events, state = await poll_turn(state, Kickoff("2 + 3?"), chat)
    use = state.pending[0]
    more, state = await poll_turn(state, Resume(state.pending, (ToolResult(use.id, "5"),)), chat)
    turn = normalize(more)
    assert (turn.terminal, turn.tool_uses) == ("requires_action", ())
    assert state.in_poll
    assert state.answering is not None
    assert state.answering.guard == "terminal"
    last, state = await poll_turn(state, Resume(), chat)
    turn = normalize(last)
    assert (turn.terminal, turn.text, turn.answered_after) == (
        "end_turn",
        "2 + 3 = 5",
        "terminal (no_terminal_tool)",
    )
    assert (state.status, state.stop_reason, state.polls) == ("idle", "end_turn", 3)
    check_exact([*events, *more, *last], state)


@pytest.mark.parametrize(
    ("spec", "guards", "chat_of"),
    [
        (SPEC, GuardConfig(), lambda: looping()),
        (TERMINAL_SPEC, NO_REPROMPTS, no_terminal_script),
    ],
)
async def test_a_host_answers_after_a_stop(
    spec: AgentSpec, guards: GuardConfig, chat_of: Any
) -> None:
    log = MemoryLog()
    async with Host(chat=chat_of(), log=log, tools={"add": add}) as host:
        session_id = await host.start(spec, "What is the sum?", guards=guards)
        info = await settle(host, session_id)
        assert (info.status, info.stop_reason) == ("idle", "end_turn")
        events = await log.read(session_id)
        assert isinstance(events[-1].event, AnsweredAfterStop)
        state = replay(events)
        check_answered(state.history)
        assert state == host._sessions[session_id].state
        assert recheck(events) is None
        assert info.text == state.history[-1]["content"]


def test_only_a_stop_with_results_and_its_setting_on_qualifies() -> None:
    state = open_session(SPEC)
    halt = Halt("loop", "going_in_circles", "stopped")
    assert not answers_after(state, halt)  # no results yet
    history = (
        *state.history,
        {"role": "user", "content": "sum?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    )
    state = msgspec.structs.replace(state, history=history, request="sum?", polls=1)
    assert episode_results(state) == ["5"]
    assert answers_after(state, halt)
    assert not answers_after(state, Halt("runner", "timeout", "stopped"))
    off = msgspec.structs.replace(state, guards=GuardConfig(loop=LoopDetection(answer=False)))
    assert not answers_after(off, halt)
    spent = msgspec.structs.replace(state, max_turns=1)
    assert not answers_after(spent, halt)
    asked = answer_request(state, halt)
    assert (asked.guard, asked.reason, asked.message) == ("loop", "going_in_circles", "stopped")
    assert asked.text == 'The user asked: "sum?"\nThe answer is 5. Say that to the user.'


# A model drawn by hypothesis: each reply a call of add with small arguments (so repeats
# happen), a call of an unknown tool, or text; replies to a request without tools drawn
# from the same list.
REPLIES = st.one_of(
    st.tuples(st.integers(0, 2), st.integers(0, 2)).map(
        lambda ab: tool_response(("add", {"a": ab[0], "b": ab[1]}))
    ),
    st.just(tool_response(("nope", {}))),
    st.sampled_from(["3", "", "the sum is 3"]).map(text_response),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    replies=st.lists(REPLIES, min_size=1, max_size=12),
    max_turns=st.integers(1, 6),
    answer=st.booleans(),
    required=st.booleans(),
)
def test_an_episode_never_exceeds_max_turns_and_ends_with_an_outcome(
    replies: list[dict[str, Any]], max_turns: int, answer: bool, required: bool
) -> None:
    script = iter(replies)

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        return next(script, text_response("done"))

    guards = GuardConfig(
        loop=LoopDetection(answer=answer),
        max_turns=MaxTurns(answer=answer),
        terminal=TerminalTool(required=required, max_reprompts=1, answer=answer),
    )

    async def go() -> Any:
        return await run(
            TERMINAL_SPEC, "sum?", chat, tools={"add": add}, max_turns=max_turns, guards=guards
        )

    result = anyio.run(go)
    events = events_of(result)
    assert result.turns == sum(isinstance(event, ModelResponded) for event in events)
    assert result.turns <= max_turns
    last = events[-1]
    ended = isinstance(last, OUTCOMES) or (
        isinstance(last, ModelResponded) and not last.message.get("tool_calls")
    )
    assert ended, last
    assert result.state.answering is None
    assert not result.state.in_poll
    check_exact(result.events, result.state)


@pytest.mark.parametrize(
    ("result", "reply", "held"),
    [
        ("42", "17 + 25 = 42", True),
        ("42", "17 + 25 = 32", False),
        ("190 dollars", "The stock price of Apple is $190", True),
        ("Paris: sunny", "Sunny.", True),
        ("rain, 16 C", "Rain in Tokyo", True),
        ("rain, 16 C", "Rain, 12 C in Tokyo", False),
        ("sunny, 21 C", "Paris", False),
        ("Lima", "I do not know.", False),
        ("x" * 200, "anything", True),
    ],
)
def test_an_answer_must_hold_a_short_result(result: str, reply: str, held: bool) -> None:
    state = open_session(SPEC)
    history = (
        *state.history,
        {"role": "user", "content": "q?"},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    )
    state = msgspec.structs.replace(state, history=history, request="q?")
    assert grounded(state, reply) is held


async def test_a_stop_message_leads_with_what_the_episode_found_and_nothing_else() -> None:
    spec = AgentSpec(system_prompt="Add with the tool.", tools=(ADD,))
    found = await run(
        spec,
        "What is 40 + 2?",
        ScriptedChat([tool_response(("add", {"a": 40, "b": 2})), text_response("42")]),
        tools={"add": add},
    )
    assert with_last_result(found.state, "lead") == "42\n\nlead"
    # A later request that has found nothing yet: the earlier request's result is not its.
    _, later, _ = begin_poll(found.state, UserMessage("Tell me a joke."), now=1.0)
    assert with_last_result(later, "lead") == "lead"
    # A request whose only tool call failed found nothing either: the error is not led with.
    failed = await run(
        spec,
        "What is 1 + x?",
        ScriptedChat([tool_response(("add", {"a": 1, "b": "x"})), text_response("sorry")]),
        tools={"add": add},
    )
    assert any("invalid arguments" in (m.get("content") or "") for m in failed.transcript)
    assert with_last_result(failed.state, "lead") == "lead"
