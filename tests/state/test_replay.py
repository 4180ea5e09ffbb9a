"""replay: a log folded back into the state, and the logs it refuses."""

from __future__ import annotations

import functools
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import (
    AgentSpec,
    ChatError,
    GuardConfig,
    LoopDetection,
    ReplayError,
    SeqError,
    ToolSpec,
    TurnkeeperError,
    Usage,
)
from turnkeeper.events import (
    ChatRetried,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Halted,
    MessageReceived,
    SessionOpened,
    TerminalToolCalled,
    ToolCalled,
    ToolReturned,
    decode_envelope,
)
from turnkeeper.logs import decode_jsonl, encode_jsonl
from turnkeeper.providers import ScriptedChat, text_response, tool_response, with_retry
from turnkeeper.sessions import RunResult, open_session, opened_event, recheck, run
from turnkeeper.state._replay import replay

SPEC = AgentSpec(
    system_prompt="Use the tools.",
    tools=(ToolSpec("search"), ToolSpec("fetch"), ToolSpec("finish")),
    terminal_tool="finish",
    model="tiny",
)


def opened_envelope(session_id: str = "s1", seq: int = 1) -> Envelope:
    return Envelope(session_id, seq, 0.0, opened_event(open_session(SPEC, session_id=session_id)))


def test_an_empty_log_is_a_replay_error() -> None:
    with pytest.raises(ReplayError, match="the log holds no events"):
        replay([])


def test_a_log_must_start_with_session_opened() -> None:
    first = Envelope("s1", 1, 0.0, MessageReceived(text="hi"))
    with pytest.raises(ReplayError) as caught:
        replay([first])
    assert str(caught.value) == (
        "session s1: seq 1 is local.user_message; "
        "a session's log must start with local.session_opened"
    )


def test_the_opening_event_must_be_seq_1() -> None:
    with pytest.raises(SeqError) as caught:
        replay([opened_envelope(seq=4)])
    assert (caught.value.session_id, caught.value.seq, caught.value.expected) == ("s1", 4, 1)


def test_a_gap_after_the_opening_is_a_seq_error() -> None:
    log = [opened_envelope(), Envelope("s1", 3, 0.0, MessageReceived(text="hi"))]
    with pytest.raises(SeqError, match="session s1: seq 3 leaves a gap"):
        replay(log)


def test_another_sessions_event_is_a_replay_error() -> None:
    log = [opened_envelope("s1"), Envelope("s2", 2, 0.0, MessageReceived(text="hi"))]
    with pytest.raises(ReplayError, match="event seq 2 belongs to session s2, not s1"):
        replay(log)


def test_two_sessions_interleaved_cannot_be_replayed_as_one() -> None:
    log = [opened_envelope("s1"), opened_envelope("s2")]
    with pytest.raises(ReplayError, match="seq 1 belongs to session s2, not s1"):
        replay(log)


@pytest.mark.parametrize(
    "calls",
    [[{"function": []}], [{"id": "a", "function": None}], [{"id": "a", "function": {"name": 5}}]],
)
def test_malformed_history_in_the_opening_is_a_replay_error(calls: Any) -> None:
    history = (
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    )
    opened = SessionOpened(
        spec=SPEC, history=history, max_turns=5, guards=GuardConfig(), resume=True
    )
    with pytest.raises(ReplayError, match=r"^session s7: seq 1: history: malformed"):
        replay([Envelope("s7", 1, 0.0, opened)])


def test_replaying_only_the_opening_gives_the_opened_state_at_seq_1() -> None:
    state = open_session(SPEC, session_id="s1")
    replayed = replay([Envelope("s1", 1, 0.0, opened_event(state))])
    assert replayed == msgspec.structs.replace(state, seq=1)


def test_replay_takes_any_iterable() -> None:
    log = [opened_envelope(), Envelope("s1", 2, 5.0, MessageReceived(text="hi"))]
    assert replay(iter(log)) == replay(tuple(log)) == replay(e for e in log)
    assert replay(log).history[-1] == {"role": "user", "content": "hi"}


async def search(q: str) -> str:
    return f"results for {q}"


async def fetch(u: int) -> str:
    raise RuntimeError(f"cannot fetch {u}")


async def no_sleep(delay: float) -> None:
    pass


def working_script() -> list[Any]:
    return [
        tool_response(("search", {"q": "a"}), ("fetch", {"u": 1}), usage=(10, 2)),
        ChatError("HTTP 503", transient=True, status=503),
        tool_response(("search", {"q": "a"}), ("fetch", {"u": 2})),
        text_response("I think it is 42."),
        tool_response(("finish", {"answer": "42"}), ("search", {"q": "b"}), usage=(30, 5)),
    ]


async def working_run() -> RunResult:
    chat = with_retry(ScriptedChat(working_script()), sleep=no_sleep)
    return await run(
        SPEC,
        "What is it?",
        chat,
        tools={"search": search, "fetch": fetch},
        require_terminal_tool=True,
        # The loop guard warns rather than stopping for an answer, so the run goes on to
        # the terminal tool.
        guards=GuardConfig(loop=LoopDetection(answer=False)),
    )


@pytest.mark.anyio
async def test_replay_of_a_run_equals_its_live_state() -> None:
    result = await working_run()
    kinds = {type(envelope.event) for envelope in result.events}
    # The run exercised retries, dedup, tools, directives and the terminal tool.
    assert {
        ChatRetried,
        DuplicateToolCall,
        ToolCalled,
        ToolReturned,
        DirectiveInjected,
        TerminalToolCalled,
    } <= kinds
    assert result.result == {"answer": "42"}
    assert replay(result.events) == result.state
    assert replay(decode_jsonl(encode_jsonl(result.events)).events) == result.state
    assert result.state.usage == Usage(40, 7)


@pytest.mark.anyio
async def test_replay_of_a_halted_run_equals_its_live_state() -> None:
    chat = ScriptedChat([tool_response(("search", {"q": "same"})) for _ in range(10)])
    result = await run(SPEC, "Go.", chat, tools={"search": search}, guards=GuardConfig())
    assert result.state.status == "halted"
    assert any(isinstance(envelope.event, Halted) for envelope in result.events)
    assert replay(result.events) == result.state


@pytest.mark.anyio
async def test_replay_of_a_run_over_several_requests_equals_its_live_state() -> None:
    first = await run(SPEC, "One.", ScriptedChat([text_response("Answer one.")]))
    chat = ScriptedChat([tool_response(("search", {"q": "x"})), text_response("Answer two.")])
    second = await run(
        SPEC,
        "Two.",
        chat,
        tools={"search": search},
        history=first.transcript,
        session_id="local_0000000000000002",
    )
    assert second.state.resume
    assert second.state.history[: len(first.transcript)] == first.transcript
    assert replay(first.events) == first.state
    assert replay(second.events) == second.state


@functools.cache
def valid_log() -> bytes:
    """The JSONL log of `working_run` (built once, outside any event loop)."""
    return encode_jsonl(anyio.run(working_run, backend="trio").events)


def test_the_valid_log_replays() -> None:
    read = decode_jsonl(valid_log())
    assert read.torn is None
    assert replay(read.events).result == {"answer": "42"}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 100_000), st.integers(1, 255)),
        min_size=1,
        max_size=3,
    ),
    st.booleans(),
)
def test_a_damaged_log_replays_or_raises_only_turnkeeper_errors(
    flips: list[tuple[int, int]], check_seq: bool
) -> None:
    data = bytearray(valid_log())
    for position, mask in flips:
        data[position % len(data)] ^= mask
    try:
        events = decode_jsonl(bytes(data), check_seq=check_seq).events
        state = replay(events)
    except TurnkeeperError:
        return
    assert state.seq == len(events)


def _as_logged_before_counts(events: tuple[Envelope, ...]) -> list[Envelope]:
    """`events` as a log written before directives said what they count decodes them: each
    `local.directive` without its `counts` field."""
    old = []
    for envelope in events:
        line = msgspec.json.decode(msgspec.json.encode(envelope))
        if line["event"]["type"] == "local.directive":
            del line["event"]["counts"]
        old.append(decode_envelope(msgspec.json.encode(line)))
    return old


@pytest.mark.anyio
async def test_an_old_log_of_loop_warnings_and_reprompts_replays_to_the_same_state() -> None:
    looping = ScriptedChat([tool_response(("search", {"q": "same"})) for _ in range(10)])
    # Answer off: with it, the stop becomes an answer before any warning.
    warned = await run(
        SPEC,
        "Go.",
        looping,
        tools={"search": search},
        guards=GuardConfig(loop=LoopDetection(answer=False)),
    )
    chatty = ScriptedChat([text_response(f"Answer {n}.") for n in range(5)])
    reprompted = await run(SPEC, "Go.", chatty, require_terminal_tool=True)
    assert warned.state.warnings >= 1
    assert reprompted.state.reprompts == 2
    for result in (warned, reprompted):
        old = _as_logged_before_counts(result.events)
        assert old == list(result.events)
        assert replay(old) == result.state
        assert recheck(old) is None
