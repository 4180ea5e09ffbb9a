"""The SessionState fold, rule by rule, over envelopes built by hand."""

from __future__ import annotations

import gc
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import (
    AgentSpec,
    Budget,
    GuardConfig,
    InputError,
    ReplayError,
    SeqError,
    ToolResult,
    ToolSpec,
    ToolUse,
    TurnkeeperError,
    Usage,
    call_key,
)
from turnkeeper.events import (
    AnyEvent,
    ApprovalDecided,
    ApprovalRequested,
    Cancelled,
    ChatFailed,
    ChatRetried,
    Compacted,
    CompactionFailed,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Failed,
    Halted,
    MessageQueued,
    MessageReceived,
    ModelResponded,
    ReplyReplaced,
    SessionOpened,
    TerminalToolCalled,
    ToolCalled,
    ToolResultsReceived,
    ToolReturned,
)
from turnkeeper.sessions import open_session, opened_event
from turnkeeper.state._replay import replay
from turnkeeper.state._results import results_received
from turnkeeper.state._state import SessionState, apply_event, fold, initial_state

SPEC = AgentSpec(
    system_prompt="You help.",
    tools=(ToolSpec("search", repeatable=True), ToolSpec("fetch"), ToolSpec("finish")),
    terminal_tool="finish",
    model="tiny",
)
SYSTEM = {"role": "system", "content": "You help."}
CALL_USAGE = Usage(3, 1)
EMPTY = msgspec.Raw(b"{}")


def call(call_id: str, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    arguments = json.dumps(args if args is not None else {})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def responded(
    *calls: dict[str, Any],
    text: str | None = None,
    finish: str | None = None,
    usage: Usage = CALL_USAGE,
    unreadable: bool = False,
) -> ModelResponded:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    reason = finish if finish is not None else ("tool_calls" if calls else "stop")
    response: dict[str, Any] = {"choices": [{"message": message, "finish_reason": reason}]}
    if unreadable:
        # As a backend flags a reply holding a tool call it could not read.
        response["turnkeeper"] = {"unreadable": True}
    return ModelResponded(
        response=msgspec.Raw(msgspec.json.encode(response)),
        message=message,
        finish_reason=reason,
        usage=usage,
    )


def compacted(start: int, end: int, kept: tuple[int, ...] = (), text: str = "S") -> Compacted:
    return Compacted(
        start=start,
        end=end,
        kept=kept,
        message={"role": "user", "content": f"Summary of the conversation so far: {text}"},
        estimated=900,
        budget=800,
        response=EMPTY,
        usage=Usage(70, 7),
    )


def results(*pairs: tuple[str, str] | tuple[str, str, bool]) -> ToolResultsReceived:
    return ToolResultsReceived(results=tuple(ToolResult(*pair) for pair in pairs))


def tool_contents(state: SessionState) -> dict[str, Any]:
    """Each tool message's content by call id, JSON-decoded where it is JSON."""
    contents: dict[str, Any] = {}
    for message in state.history:
        if message["role"] == "tool":
            assert message["tool_call_id"] not in contents, "a call answered twice"
            try:
                contents[message["tool_call_id"]] = json.loads(message["content"])
            except json.JSONDecodeError:
                contents[message["tool_call_id"]] = message["content"]
    return contents


class Log:
    """A session advanced by hand-built envelopes, one seq at a time."""

    def __init__(self, spec: AgentSpec = SPEC, **options: Any) -> None:
        self.state = open_session(spec, session_id="s1", **options)
        self.events: list[Envelope] = []
        self.at = 1000.0
        self.push(opened_event(self.state))

    def push(self, event: AnyEvent) -> SessionState:
        self.at += 1
        envelope = Envelope(self.state.session_id, self.state.seq + 1, self.at, event)
        self.state = apply_event(self.state, envelope)
        self.events.append(envelope)
        return self.state

    def replayed(self) -> SessionState:
        return replay(self.events)


def test_opening_logs_seq_1_and_keeps_the_state() -> None:
    log = Log()
    assert log.state.seq == 1
    assert log.state.history == (SYSTEM,)
    assert log.state.status == "idle"
    assert log.state.pending == ()


def test_states_are_not_tracked_by_the_cycle_collector() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    assert not gc.is_tracked(log.state)
    assert not gc.is_tracked(log.replayed())


def test_user_message_starts_a_running_episode() -> None:
    log = Log()
    state = log.push(MessageReceived(text="hi"))
    assert state.history == (SYSTEM, {"role": "user", "content": "hi"})
    assert state.status == "running"
    assert state.episode_started == log.at
    assert state.seq == 2


def test_queued_messages_wait_in_order_and_each_delivery_takes_the_oldest() -> None:
    log = Log()
    log.push(MessageReceived(text="first"))
    log.push(MessageQueued(text="second"))
    state = log.push(MessageQueued(text="third"))
    assert state.queued == ("second", "third")
    assert state.status == "running"
    assert state.history[-1] == {"role": "user", "content": "first"}
    state = log.push(MessageReceived(text="second"))
    assert state.queued == ("third",)
    # A message that was not queued leaves the queue as it is.
    state = log.push(MessageReceived(text="something else"))
    assert state.queued == ("third",)
    state = log.push(MessageReceived(text="third"))
    assert state.queued == ()
    assert log.replayed() == state


def test_tool_calls_become_pending_and_are_seen() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    event = responded(call("a", "search", {"q": "x", "n": 1}), call("b", "fetch"))
    state = log.push(event)
    assert state.pending == (
        ToolUse("a", "search", {"q": "x", "n": 1}),
        ToolUse("b", "fetch", {}),
    )
    assert state.status == "requires_action"
    assert state.stop_reason == "tool_use"
    assert state.polls == 1
    assert state.seen == {'search\x1f{"n":1,"q":"x"}', "fetch\x1f{}"}
    assert state.history[-1] is event.message
    assert state.usage == state.episode_usage == Usage(3, 1)


def test_a_text_reply_ends_the_turn_with_its_finish_reason() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    state = log.push(responded(text="Done.", finish="length"))
    assert (state.status, state.stop_reason, state.pending) == ("idle", "length", ())
    state = log.push(responded(text="Again.", finish=None))
    assert state.stop_reason == "stop"
    log.push(MessageReceived(text="more"))
    response = responded(text="x")
    state = log.push(msgspec.structs.replace(response, finish_reason=None))
    assert state.stop_reason == "unknown"


def test_user_message_resets_the_episode_and_skips_pending_calls() -> None:
    log = Log()
    log.push(MessageReceived(text="first"))
    log.push(responded(call("a", "search", {"q": 1})))
    log.push(results(("a", "bad", True)))
    log.push(responded(call("b", "search", {"q": 1})))
    log.push(results(("b", "bad", True)))
    log.push(DirectiveInjected(guard="loop", text="You are repeating yourself."))
    log.push(DirectiveInjected(guard="terminal", text="Call finish."))
    log.push(responded(call("c", "fetch"), call("d", "search", {"q": 2})))
    before = log.state
    assert before.polls == 3
    assert before.error_counts == {"search": 2}
    assert before.repeats == 1
    assert (before.warnings, before.reprompts) == (1, 1)
    assert before.seen

    state = log.push(MessageReceived(text="second"))

    assert state.history[: len(before.history)] == before.history
    skipped = {"skipped": True, "message": "not run: a new user message arrived"}
    added = state.history[len(before.history) :]
    assert [(m["role"], m.get("tool_call_id")) for m in added] == [
        ("tool", "c"),
        ("tool", "d"),
        ("user", None),
    ]
    assert [json.loads(m["content"]) for m in added[:2]] == [skipped, skipped]
    assert added[2]["content"] == "second"
    assert state.status == "running"
    assert state.pending == ()
    assert state.polls == 0
    assert state.seen == frozenset()
    assert state.error_counts == {}
    assert state.answers == {}
    assert state.texts == frozenset()
    assert (state.repeats, state.warnings, state.warned_repeats, state.reprompts) == (0, 0, 0, 0)
    assert state.last_repeat is None
    assert state.episode_usage == Usage()
    assert state.usage == Usage(9, 3)
    assert state.episode_started == log.at
    assert (state.stop_reason, state.result) == (None, None)
    assert log.replayed() == state


def test_tool_results_append_tool_messages_in_call_order() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search"), call("b", "fetch"), call("c", "search", {"q": 1})))
    before = log.state
    state = log.push(results(("a", "A"), ("b", "B failed", True), ("c", "C")))
    added = state.history[len(before.history) :]
    assert added == (
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "tool", "tool_call_id": "b", "content": '{"error":"B failed","isError":true}'},
        {"role": "tool", "tool_call_id": "c", "content": "C"},
    )
    assert json.loads(added[1]["content"]) == {"error": "B failed", "isError": True}
    assert (state.status, state.pending, state.stop_reason) == ("running", (), None)


def test_error_counts_count_consecutive_failures_per_tool() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search"), call("b", "fetch")))
    state = log.push(results(("a", "no", True), ("b", "ok")))
    assert state.error_counts == {"search": 1}
    log.push(responded(call("c", "search", {"q": 2}), call("d", "fetch", {"q": 2})))
    state = log.push(results(("c", "no", True), ("d", "no", True)))
    assert state.error_counts == {"search": 2, "fetch": 1}
    log.push(responded(call("e", "search", {"q": 3})))
    state = log.push(results(("e", "fine")))
    assert state.error_counts == {"fetch": 1}


def test_the_same_call_with_the_same_answer_counts_as_a_repeat() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search", {"q": "x", "page": 1})))
    state = log.push(results(("a", "same")))
    assert state.repeats == 0
    # Key order does not matter: the arguments are compared canonically.
    log.push(responded(call("b", "search", {"page": 1, "q": "x"})))
    state = log.push(results(("b", "same")))
    assert state.repeats == 1
    assert state.last_repeat == 'search({"page":1,"q":"x"})'
    log.push(responded(call("c", "search", {"page": 1, "q": "x"})))
    state = log.push(results(("c", "different")))
    assert state.repeats == 1
    log.push(responded(call("d", "search", {"page": 2, "q": "x"})))
    state = log.push(results(("d", "different")))
    assert state.repeats == 1
    log.push(responded(call("e", "search", {"page": 1, "q": "x"})))
    state = log.push(results(("e", "different")))
    assert state.repeats == 2


def test_the_same_reply_text_counts_as_a_repeat() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    state = log.push(responded(text="I am  done."))
    assert state.repeats == 0
    log.push(DirectiveInjected(guard="terminal", text="Call finish."))
    state = log.push(responded(text=" I am\ndone. "))
    assert state.repeats == 1
    assert state.last_repeat == "the same reply as before"
    log.push(DirectiveInjected(guard="terminal", text="Call finish."))
    log.push(responded(text="   "))
    log.push(DirectiveInjected(guard="terminal", text="Call finish."))
    state = log.push(responded(text="   "))
    assert state.repeats == 1


def test_a_duplicate_call_is_self_answered() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search", {"q": 1})))
    log.push(results(("a", "A")))
    log.push(responded(call("b", "fetch"), call("c", "search", {"q": 1})))
    event = DuplicateToolCall(
        tool_call_id="c", name="search", arguments='{"q":1}', message="Already called."
    )
    state = log.push(event)
    assert state.history[-1] == {
        "role": "tool",
        "tool_call_id": "c",
        "content": '{"duplicate":true,"message":"Already called."}',
    }
    assert state.pending == (ToolUse("b", "fetch", {}),)
    assert state.status == "requires_action"
    assert (state.repeats, state.last_repeat) == (1, 'search({"q":1})')


def test_when_every_call_is_a_duplicate_the_session_runs_on() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search")))
    log.push(results(("a", "A")))
    log.push(responded(call("b", "search")))
    state = log.push(
        DuplicateToolCall(tool_call_id="b", name="search", arguments="{}", message="x")
    )
    assert (state.pending, state.status) == ((), "running")


def test_a_directive_while_calls_are_pending_follows_their_answers() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search"), call("b", "fetch")))
    before = log.state
    state = log.push(DirectiveInjected(guard="consecutive_errors", text="Fix it."))
    assert state.history == before.history
    assert state.deferred == ({"role": "user", "content": "Fix it."},)
    assert state.status == "requires_action"
    state = log.push(results(("a", "A"), ("b", "B")))
    assert [m["role"] for m in state.history[len(before.history) :]] == ["tool", "tool", "user"]
    assert state.history[-1] == {"role": "user", "content": "Fix it."}
    assert state.deferred == ()


def test_a_directive_with_nothing_pending_is_appended_and_wakes_the_session() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(text="Done."))
    assert log.state.stop_reason == "stop"
    state = log.push(DirectiveInjected(guard="terminal", text="Call finish."))
    assert state.history[-1] == {"role": "user", "content": "Call finish."}
    assert (state.status, state.stop_reason, state.reprompts) == ("running", None, 1)
    assert state.deferred == ()


def test_a_loop_warning_remembers_how_many_repeats_it_saw() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    for call_id in ("a", "b"):
        log.push(responded(call(call_id, "search")))
        log.push(results((call_id, "same")))
    state = log.push(DirectiveInjected(guard="loop", text="You are going in circles."))
    assert (state.warnings, state.warned_repeats, state.repeats) == (1, 1, 1)
    assert (state.reprompts, state.status) == (0, "running")


def test_halted_answers_pending_calls_with_returned_results_or_a_skip_notice() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search"), call("b", "fetch"), call("c", "search", {"q": 1})))
    log.push(DirectiveInjected(guard="loop", text="Deferred."))
    log.push(ToolCalled(tool_call_id="a", name="search", input={}))
    log.push(ToolReturned(tool_call_id="a", text="A"))
    log.push(ToolReturned(tool_call_id="c", text="C broke", is_error=True))
    state = log.push(ToolReturned(tool_call_id="zzz", text="not pending"))
    assert [r.tool_use_id for r in state.returned] == ["a", "c"]
    before = log.state
    state = log.push(Halted(guard="budget", reason="budget_exceeded", message="Out of tokens."))
    skipped = {"skipped": True, "message": "not run: budget_exceeded"}
    assert tool_contents(state) == {
        "a": "A",
        "b": skipped,
        "c": {"error": "C broke", "isError": True},
    }
    added = state.history[len(before.history) :]
    assert [m.get("tool_call_id") for m in added] == ["a", "b", "c", None]
    assert added[-1] == {"role": "user", "content": "Deferred."}
    assert (state.status, state.stop_reason) == ("halted", "budget_exceeded")
    assert (state.pending, state.returned, state.deferred) == ((), (), ())
    assert log.replayed() == state


def test_halted_with_nothing_pending_keeps_the_history() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    before = log.state
    state = log.push(Halted(guard="max_turns", reason="max_turns_exceeded", message="x"))
    assert state.history == before.history
    assert (state.status, state.stop_reason) == ("halted", "max_turns_exceeded")


def test_terminal_tool_answers_its_call_and_skips_the_rest() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(
        responded(call("a", "search"), call("t", "finish", {"answer": 42}), call("b", "fetch"))
    )
    state = log.push(TerminalToolCalled(tool_call_id="t", name="finish", result={"answer": 42}))
    skipped = {"skipped": True, "message": "not run: finish ended the run"}
    assert tool_contents(state) == {"t": {"ok": True}, "a": skipped, "b": skipped}
    assert [m["role"] for m in state.history[-3:]] == ["tool"] * 3
    assert (state.status, state.stop_reason, state.result) == (
        "idle",
        "terminal_tool",
        {"answer": 42},
    )
    assert state.pending == ()
    assert log.replayed() == state


def test_cancelled_skips_pending_calls() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search")))
    state = log.push(Cancelled(reason="user asked"))
    assert tool_contents(state) == {
        "a": {"skipped": True, "message": "not run: the session was cancelled"}
    }
    assert (state.status, state.stop_reason, state.pending) == ("cancelled", "cancelled", ())


def test_failed_marks_the_session_and_keeps_its_history() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    before = log.state
    state = log.push(Failed(error="crash loop"))
    assert (state.status, state.stop_reason) == ("failed", "failed")
    assert state.history == before.history


@pytest.mark.parametrize(
    "event",
    [
        ChatRetried(attempt=1, delay=0.5, error="HTTP 503", status=503),
        ChatFailed(error="HTTP 400", transient=False, status=400),
    ],
    ids=lambda e: type(e).__name__,
)
def test_informational_events_only_advance_the_seq(event: AnyEvent) -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search")))
    before = log.state
    assert log.push(event) == msgspec.structs.replace(before, seq=before.seq + 1)


def test_a_tool_call_logged_is_remembered_until_the_next_reply() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search"), call("b", "search")))
    before = log.state
    state = log.push(ToolCalled(tool_call_id="a", name="search", input={}))
    assert state == msgspec.structs.replace(before, seq=before.seq + 1, called=frozenset({"a"}))
    # A call that is not pending is not remembered.
    assert log.push(ToolCalled(tool_call_id="z", name="search", input={})).called == {"a"}
    log.push(ToolReturned(tool_call_id="a", text="ok"))
    log.push(ToolReturned(tool_call_id="b", text="ok"))
    log.push(results(("a", "ok"), ("b", "ok")))
    assert log.push(responded(call("a", "search"))).called == frozenset()


def test_results_that_do_not_match_the_pending_calls_are_a_replay_error() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search"), call("b", "fetch")))
    with pytest.raises(ReplayError, match=r"session s1: seq 4 answers tool calls \['a'\]"):
        log.push(results(("a", "A")))
    with pytest.raises(ReplayError, match="session s1: seq 4"):
        log.push(results(("a", "A"), ("b", "B"), ("x", "X")))


def test_a_second_session_opened_is_a_replay_error() -> None:
    log = Log()
    with pytest.raises(ReplayError, match="session s1: seq 2 opens the session a second time"):
        log.push(opened_event(log.state))


def test_a_logged_response_with_malformed_tool_calls_is_a_replay_error() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    for calls in ([{"id": "a"}], [5], [{"id": "a", "function": {"name": ["x"]}}], {"id": "a"}):
        message = {"role": "assistant", "tool_calls": calls}
        event = ModelResponded(response=EMPTY, message=message, finish_reason=None, usage=Usage())
        with pytest.raises(ReplayError, match="session s1: seq 3: tool_calls"):
            log.push(event)


def test_apply_event_rejects_another_sessions_event() -> None:
    log = Log()
    stranger = Envelope("s2", 2, 0.0, MessageReceived(text="hi"))
    with pytest.raises(ReplayError, match="event seq 2 belongs to session s2, not s1"):
        apply_event(log.state, stranger)


@pytest.mark.parametrize("seq", [1, 3, 10])
def test_apply_event_rejects_a_seq_that_does_not_follow(seq: int) -> None:
    log = Log()
    before = log.state
    with pytest.raises(SeqError) as caught:
        apply_event(before, Envelope("s1", seq, 0.0, MessageReceived(text="hi")))
    assert (caught.value.session_id, caught.value.seq, caught.value.expected) == ("s1", seq, 2)
    assert log.state == before


def test_a_compaction_puts_its_summary_in_place_of_older_turns_and_keeps_the_request() -> None:
    log = Log()
    log.push(MessageReceived(text="first"))
    log.push(responded(call("a", "fetch")))
    log.push(results(("a", "one")))
    log.push(responded(text="The first is one."))
    log.push(MessageReceived(text="second"))
    log.push(responded(call("b", "fetch")))
    log.push(results(("b", "two")))
    before = log.state
    # Messages 1 to 6 (the first episode, the second's request and first step) give way
    # to the summary, but for the request (5), which follows it.
    after = log.push(compacted(1, 8, (5,), "one found"))
    summary = {"role": "user", "content": "Summary of the conversation so far: one found"}
    assert after.history == (
        SYSTEM,
        summary,
        {"role": "user", "content": "second"},
        *before.history[8:],
    )
    assert (after.usage, after.episode_usage) == (
        before.usage + Usage(70, 7),
        before.episode_usage + Usage(70, 7),
    )
    # Nothing else of the state moves: the episode, its calls and answers stay as they were.
    assert msgspec.structs.replace(after, history=before.history, usage=before.usage) == (
        msgspec.structs.replace(before, seq=after.seq, episode_usage=after.episode_usage)
    )
    assert log.replayed() == after
    assert fold(log.replayed(), []) == after


def test_a_compaction_out_of_the_history_is_a_replay_error() -> None:
    for event in (compacted(1, 9), compacted(3, 2), compacted(1, 3, (3,)), compacted(1, 4, (2, 2))):
        log = Log()
        log.push(MessageReceived(text="hi"))
        log.push(responded(text="hello"))
        envelope = Envelope("s1", log.state.seq + 1, 2000.0, event)
        with pytest.raises(ReplayError, match=r"^session s1: seq 4 compacts messages"):
            apply_event(log.state, envelope)
        with pytest.raises(ReplayError, match=r"^session s1: seq 4 compacts messages"):
            replay([*log.events, envelope])


def test_a_failed_compaction_is_remembered_until_the_next_request() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    failed = log.push(
        CompactionFailed(error="HTTP 400", estimated=900, budget=800, usage=Usage(5, 0))
    )
    assert failed.compaction_failed
    assert failed.usage == Usage(5, 0)
    assert failed.history == (SYSTEM, {"role": "user", "content": "hi"})
    log.push(responded(text="hello"))
    assert log.state.compaction_failed
    assert not log.push(MessageReceived(text="again")).compaction_failed
    assert log.replayed() == log.state


def test_fold_applies_events_in_order() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search")))
    log.push(results(("a", "A")))
    log.push(responded(text="Done."))
    start = initial_state("s1", opened_event(open_session(SPEC, session_id="s1")))
    assert fold(start, log.events) == log.state
    assert fold(start, tuple(log.events)) == log.state
    assert fold(log.state, []) == log.state
    with pytest.raises(SeqError):
        fold(start, log.events[1:])


@pytest.mark.parametrize("calls", [(), (call("a", "search"),)])
def test_a_response_flagged_unreadable_is_remembered(calls: tuple[dict[str, Any], ...]) -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(*calls, text="<tool_call>{oops", unreadable=True))
    start = initial_state("s1", opened_event(open_session(SPEC, session_id="s1")))
    assert (log.state.last_unreadable, fold(start, log.events).last_unreadable) == (True, True)
    log.push(results(("a", "A")) if calls else MessageReceived(text="again"))
    log.push(responded(text="Done."))
    assert (log.state.last_unreadable, fold(start, log.events).last_unreadable) == (False, False)


@pytest.mark.parametrize(
    ("text", "finish", "flawed"),
    [
        ("The weather is", "length", True),
        (None, "length", True),
        ("I will check. " * 10, "stop", True),
        ("Done.", "stop", False),
    ],
)
def test_a_reply_that_is_no_answer_is_remembered_until_the_next(
    text: str | None, finish: str, flawed: bool
) -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(text=text, finish=finish))
    assert (log.state.last_flawed, log.replayed().last_flawed) == (flawed, flawed)
    log.push(DirectiveInjected(guard="repair", text="Reply again."))
    log.push(results())
    log.push(responded(call("a", "search")))
    assert (log.state.last_flawed, log.replayed().last_flawed) == (False, False)


def test_the_last_steps_failure_is_remembered_until_a_step_succeeds() -> None:
    log = Log()
    log.push(MessageReceived(text="hi"))
    log.push(responded(call("a", "search", {"q": 1}), call("b", "search", {"q": 2})))
    log.push(results(("a", "fine"), ("b", "boom", True)))
    assert (log.state.last_failure, log.replayed().last_failure) == ("boom", "boom")
    assert log.state.seen == {call_key("search", {"q": 1})}
    log.push(responded(text="Sorry", finish="length"))
    log.push(results())
    assert (log.state.last_failure, log.replayed().last_failure) == ("boom", "boom")
    log.push(responded(call("c", "search", {"q": 3})))
    log.push(results(("c", "fine")))
    assert (log.state.last_failure, log.replayed().last_failure) == (None, None)
    log.push(responded(call("d", "search", {"q": 4})))
    log.push(results(("d", "boom", True)))
    log.push(MessageReceived(text="again"))
    assert (log.state.last_failure, log.replayed().last_failure) == (None, None)


def test_states_are_frozen() -> None:
    state = Log().state
    with pytest.raises(AttributeError):
        state.status = "running"  # type: ignore[misc]


def opened(*history: dict[str, Any]) -> SessionOpened:
    return SessionOpened(
        spec=SPEC, history=history, max_turns=9, guards=GuardConfig(loop=None), resume=True
    )


USER = {"role": "user", "content": "hi"}


def assistant(*calls: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def answer(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


TWO_CALLS = assistant(call("a", "search"), call("b", "fetch"))
ONE_CALL = assistant(call("a", "search"))


@pytest.mark.parametrize(
    ("history", "pending", "status"),
    [
        ((), (), "idle"),
        ((SYSTEM,), (), "idle"),
        ((SYSTEM, USER), (), "running"),
        ((SYSTEM, USER, assistant(text="Hello.")), (), "idle"),
        ((SYSTEM, USER, TWO_CALLS), ("a", "b"), "requires_action"),
        ((SYSTEM, USER, TWO_CALLS, answer("a")), ("b",), "requires_action"),
        ((SYSTEM, USER, TWO_CALLS, answer("b"), answer("a")), (), "running"),
        ((SYSTEM, USER, ONE_CALL, answer("a"), USER), (), "running"),
        ((SYSTEM, USER, ONE_CALL, answer("a"), assistant(text="Done.")), (), "idle"),
    ],
)
def test_initial_state_derives_pending_and_status_from_the_transcript(
    history: tuple[dict[str, Any], ...], pending: tuple[str, ...], status: str
) -> None:
    state = initial_state("s9", opened(*history))
    assert [use.id for use in state.pending] == list(pending)
    assert state.status == status
    assert state.history == history
    assert (state.session_id, state.seq, state.max_turns, state.resume) == ("s9", 0, 9, True)
    assert state.guards == GuardConfig(loop=None)


def test_initial_state_decodes_pending_arguments() -> None:
    state = initial_state("s9", opened(SYSTEM, USER, assistant(call("a", "search", {"q": [1]}))))
    assert state.pending == (ToolUse("a", "search", {"q": [1]}),)


@pytest.mark.parametrize(
    "calls",
    [[{"function": None}], [{"id": "a"}], ["x"], [{"id": 1, "function": {"name": "f"}}], 7],
)
def test_initial_state_rejects_malformed_tool_calls(calls: Any) -> None:
    history = (SYSTEM, USER, {"role": "assistant", "tool_calls": calls})
    with pytest.raises(InputError, match="history: malformed assistant tool_calls"):
        initial_state("s9", opened(*history))


# Events for the fold property: tool round trips (with repeatable tools, errors, results
# out of order, missing or extra) mixed with every other kind of event.
IDS = st.sampled_from(["a", "b", "c"])
# search is repeatable: loop detection remembers its answers.
TOOLS = st.sampled_from(["fetch", "fetch", "finish", "search"])
ARGUMENTS = st.sampled_from([{}, {"q": 1}, {"q": 2}])
TEXTS = st.sampled_from(["Done.", "done", "  ", "Working on it."])
GUARDS = st.sampled_from(["loop", "terminal", "final_turn"])


other_event = st.one_of(
    st.builds(
        lambda text, flag, finish: responded(text=text, unreadable=flag, finish=finish),
        TEXTS | st.just("Again. " * 20),
        st.booleans(),
        st.sampled_from([None, "length"]),
    ),
    st.builds(lambda: ModelResponded(EMPTY, {"role": "assistant", "tool_calls": 5}, None, Usage())),
    st.builds(MessageReceived, text=TEXTS),
    st.builds(MessageQueued, text=TEXTS),
    st.builds(DirectiveInjected, guard=GUARDS, text=TEXTS),
    st.builds(
        DuplicateToolCall, tool_call_id=IDS, name=TOOLS, arguments=st.just("{}"), message=TEXTS
    ),
    st.builds(ReplyReplaced, guard=GUARDS, text=TEXTS),
    st.builds(Halted, guard=GUARDS, reason=st.just("looping"), message=TEXTS),
    st.builds(TerminalToolCalled, tool_call_id=IDS, name=st.just("finish"), result=ARGUMENTS),
    st.builds(Cancelled, reason=TEXTS),
    st.builds(Failed, error=TEXTS),
    st.builds(ChatRetried, attempt=st.just(1), delay=st.just(0.5), error=TEXTS),
    st.builds(ToolCalled, tool_call_id=IDS, name=TOOLS, input=ARGUMENTS),
    st.builds(ToolReturned, tool_call_id=IDS, text=TEXTS, is_error=st.booleans()),
    # Mostly in range of a short history, now and then not (a ReplayError either way).
    st.builds(
        lambda start, length, kept, text: compacted(start, start + length, kept, text),
        st.integers(0, 3),
        st.integers(0, 6),
        st.lists(st.integers(0, 9), max_size=2, unique=True).map(lambda kept: tuple(sorted(kept))),
        TEXTS,
    ),
    st.builds(CompactionFailed, error=TEXTS, estimated=st.just(9), budget=st.just(5)),
    st.builds(ApprovalRequested, tool_call_ids=st.lists(IDS, min_size=1, max_size=2).map(tuple)),
    st.builds(ApprovalDecided, tool_call_id=IDS, approved=st.booleans()),
)


@st.composite
def round_trip(draw: st.DrawFn) -> list[AnyEvent]:
    """A response calling tools, some of their results one by one, then all of them (each
    that a result before holds given by position, as a session logs them, or each whole,
    as an older log holds them); now and then with two calls of one id, another event on
    the way, a wrong set of results, positions that give no result, or none."""
    rare = st.integers(0, 5).map(lambda number: number == 0)
    ids = draw(st.lists(IDS, min_size=1, max_size=3, unique=not draw(rare)))
    calls = [(call_id, draw(TOOLS), draw(ARGUMENTS)) for call_id in ids]
    events: list[AnyEvent] = [responded(*(call(*made) for made in calls), unreadable=draw(rare))]
    answers = [(call_id, draw(TEXTS), draw(rare)) for call_id in ids]
    returned: list[ToolResult] = []
    for call_id, text, is_error in draw(st.permutations(answers)):
        if draw(st.booleans()):
            events.append(ToolCalled(tool_call_id=call_id, name="search", input={}))
        if draw(st.booleans()):
            events.append(ToolReturned(tool_call_id=call_id, text=text, is_error=is_error))
            returned.append(ToolResult(call_id, text, is_error))
    if draw(rare):
        events.append(draw(other_event))
    answered = draw(st.permutations(answers))
    if draw(st.integers(0, 19)) == 0:
        answered = draw(st.lists(st.tuples(IDS, TEXTS, st.booleans()), max_size=3))
    if not draw(rare):
        given = results(*answered)
        if draw(st.booleans()):
            given = results_received(returned, given.results)
        if draw(st.integers(0, 19)) == 0:
            logged = draw(st.lists(st.integers(0, 3), max_size=2).map(tuple))
            given = ToolResultsReceived(results=given.results, logged=logged)
        events.append(given)
    return events


@st.composite
def logged_trip(draw: st.DrawFn) -> list[AnyEvent]:
    """A response making one call, its call and result logged, then the results giving it
    by position: a round trip as a session logs most of them (the fold's commonest). Now
    and then the result is logged twice (the last counts) or not at all, or the position
    is of another call's result (a damaged log)."""
    rare = st.integers(0, 5).map(lambda number: number == 0)
    call_id, is_error = draw(IDS), draw(st.booleans())
    events: list[AnyEvent] = [responded(call(call_id, draw(TOOLS), draw(ARGUMENTS)))]
    if draw(st.booleans()):
        events.append(ToolCalled(tool_call_id=call_id, name="search", input={}))
    texts = draw(st.lists(TEXTS, min_size=0 if draw(rare) else 1, max_size=2 if draw(rare) else 1))
    for text in texts:
        events.append(ToolReturned(tool_call_id=call_id, text=text, is_error=is_error))
    given = ToolResult(draw(IDS) if draw(rare) else call_id, "", is_error)
    events.append(ToolResultsReceived(results=(given,), logged=(0,)))
    return events


session_events = st.lists(
    st.one_of(
        round_trip(),
        round_trip(),
        logged_trip(),
        st.lists(other_event, min_size=1, max_size=2),
    ),
    max_size=12,
).map(lambda parts: [event for part in parts for event in part])
configs = st.sampled_from(
    [GuardConfig(), GuardConfig(duplicates=None), GuardConfig(budget=Budget(max_tokens=9))]
)


def test_a_call_or_result_logged_after_its_results_is_folded_as_applied() -> None:
    """Logged again once the results are in (a resumed session's late `local.tool_call`
    and `local.tool_result`), a call of the round trip belongs to no pending call: the
    fold must not keep it where applying each event drops it (hypothesis found this)."""
    state = open_session(SPEC, session_id="s1")
    events: list[AnyEvent] = [
        opened_event(state),
        MessageReceived(text="go"),
        responded(call("c", "fetch")),
        ToolReturned(tool_call_id="c", text="ok"),
        results(("c", "ok")),
        ToolCalled(tool_call_id="c", name="fetch", input={}),
        ToolReturned(tool_call_id="c", text="late"),
    ]
    envelopes = [Envelope("s1", seq, 1000.0 + seq, event) for seq, event in enumerate(events, 1)]
    folded_state = fold(state, envelopes)
    assert folded_state == one_by_one(state, envelopes)
    assert folded_state.called == frozenset()
    assert folded_state.returned == ()


def given_by_position(call_id: str, is_error: bool = False) -> ToolResultsReceived:
    """The results of one call as a session logs them: given by position."""
    return ToolResultsReceived(results=(ToolResult(call_id, "", is_error),), logged=(0,))


@pytest.mark.parametrize(
    "between",
    [
        # A result logged for the reply before, which had no results: not this call's.
        [ToolReturned(tool_call_id="a", text="old")],
        # A directive while the call is pending: it follows the call's answer.
        [DirectiveInjected(guard="loop", text="Stop."), ToolReturned(tool_call_id="b", text="ok")],
    ],
)
def test_a_result_given_by_position_is_folded_as_applied(between: list[AnyEvent]) -> None:
    state = open_session(SPEC, session_id="s1")
    events: list[AnyEvent] = [
        opened_event(state),
        MessageReceived(text="go"),
        responded(call("a", "fetch")),
        *between[:1],
        responded(call("b", "fetch", {"q": 1})),
        *between[1:],
        given_by_position("b"),
    ]
    envelopes = [Envelope("s1", seq, 1000.0 + seq, event) for seq, event in enumerate(events, 1)]
    assert folded(state, envelopes) == one_by_one(state, envelopes)


def one_by_one(state: SessionState, envelopes: list[Envelope]) -> SessionState | str:
    """`envelopes` applied with apply_event, or the error that stopped them."""
    try:
        for envelope in envelopes:
            state = apply_event(state, envelope)
    except TurnkeeperError as exc:
        return f"{type(exc).__name__}: {exc}"
    return state


def folded(state: SessionState, envelopes: list[Envelope]) -> SessionState | str:
    """`envelopes` applied in one fold, or the error that stopped it."""
    try:
        return fold(state, envelopes)
    except TurnkeeperError as exc:
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=300, deadline=None)
@given(events=session_events, config=configs, start=st.integers(0, 40))
def test_fold_equals_applying_each_event(
    events: list[AnyEvent], config: GuardConfig, start: int
) -> None:
    state = open_session(SPEC, session_id="s1", guards=config)
    envelopes = [
        Envelope("s1", seq, 1000.0 + seq, event)
        for seq, event in enumerate([opened_event(state), MessageReceived(text="go"), *events], 1)
    ]
    # From the start, and from a state part of the way in.
    middle = one_by_one(state, envelopes[:start])
    if isinstance(middle, SessionState):
        assert folded(middle, envelopes[start:]) == one_by_one(middle, envelopes[start:])
    assert folded(state, envelopes) == one_by_one(state, envelopes)


def test_sessions_opened_with_equal_guard_configs_share_one() -> None:
    spec = AgentSpec(tools=(ToolSpec("search"),))
    first = initial_state(
        "local_a",
        SessionOpened(spec=spec, history=(), max_turns=50, guards=GuardConfig(), resume=False),
    )
    # Decoded from a log, as a host's recovered sessions are: equal, not the same object.
    decoded = msgspec.json.decode(msgspec.json.encode(GuardConfig()), type=GuardConfig)
    again = initial_state(
        "local_b", SessionOpened(spec=spec, history=(), max_turns=50, guards=decoded, resume=False)
    )
    assert again.guards is first.guards
    other = GuardConfig(loop=None)
    changed = initial_state(
        "local_c", SessionOpened(spec=spec, history=(), max_turns=50, guards=other, resume=False)
    )
    assert changed.guards == other
    assert changed.guards is not first.guards
