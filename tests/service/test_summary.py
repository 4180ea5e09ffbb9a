"""The session list's light fold (`Tracker`) against the real one: for generated sessions
(user messages, tool calls with results or errors, duplicates, guard halts, terminal tool
calls, queued messages, failed calls, summaries of older turns, cancels and crashes),
after every event the fields the status follows from are the fold's own; and a log that
is no session's is `unreadable`."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, ChatError, GuardConfig, ToolResult, ToolSpec, Usage
from turnkeeper.events import (
    ApprovalDecided,
    Cancelled,
    ChatFailed,
    Envelope,
    Failed,
    MessageQueued,
    MessageReceived,
    ToolCalled,
    ToolReturned,
)
from turnkeeper.providers import text_response, tool_response
from turnkeeper.service._summary import Tracker
from turnkeeper.sessions import Resume, UserMessage, begin_poll, emit, end_poll, open_session
from turnkeeper.sessions._compaction import Plan, compaction_events, older_turns
from turnkeeper.state import (
    SessionState,
    apply_event,
    approval_request,
    awaiting_approval,
    replay,
)

TOOLS = tuple(
    ToolSpec(
        name,
        f"The {name} tool.",
        {"type": "object", "properties": {"n": {"type": "integer"}}},
        # Calls of b with n = 1 need approval.
        approval={"properties": {"n": {"const": 1}}} if name == "b" else "never",
    )
    for name in ("a", "b", "finish")
)
SPEC = AgentSpec(system_prompt="Use the tools.", tools=TOOLS, terminal_tool="finish")

replies = st.one_of(
    st.sampled_from(["done", "done", "again"]).map(lambda text: ("text", text)),
    st.lists(
        st.tuples(st.sampled_from(["a", "a", "b", "finish"]), st.integers(0, 1)),
        min_size=1,
        max_size=2,
    ).map(lambda calls: ("calls", calls)),
    st.just(("fail", "")),
    # Older turns summarised before the model's reply ("done"), or the summary failing.
    st.sampled_from([("compact", "ok"), ("compact", "fail")]),
)
steps = st.lists(
    st.tuples(
        replies,
        st.sampled_from(["results", "error", "queue", "message", "cancel", "crash", "announce"]),
    ),
    max_size=14,
)


def response(reply: tuple[str, Any], seq: int) -> dict[str, Any]:
    kind, value = reply
    if kind == "fail":
        return text_response("recovered", usage=(7, 2))
    if kind == "compact":
        return text_response("done", usage=(7, 2))
    if kind == "text":
        return text_response(value, usage=(7, 2))
    return tool_response(
        *((name, {"n": n}, f"call_{seq}_{i}") for i, (name, n) in enumerate(value)), usage=(9, 3)
    )


class Session:
    """A session driven as a Host drives it, its events checked against a Tracker."""

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self.tracker = Tracker(state.session_id)
        # The real fold's state after each event (begin_poll and end_poll give only the last).
        self.folded = state
        self.clock = 1000.0

    def take(self, events: list[Envelope]) -> None:
        for envelope in events:
            self.tracker.apply(envelope)
            self.folded = (
                replay([envelope]) if envelope.seq == 1 else apply_event(self.folded, envelope)
            )
            assert_same(self.tracker, self.folded)

    def emit(self, event: Any) -> None:
        self.clock += 1
        envelope, self.state = emit(self.state, event, at=self.clock)
        self.take([envelope])

    def poll(self, given: Any, reply: tuple[str, Any]) -> None:
        self.clock += 1
        events, self.state, request = begin_poll(self.state, given, now=self.clock)
        self.take(events)
        if request is None:
            return
        if reply[0] == "fail":
            self.emit(ChatFailed(error="connection refused", transient=True))
            return
        if reply[0] == "compact":
            start, end, kept = older_turns(self.state, 1)
            plan = Plan(self.state.history, start, end, kept, 900, 800, {})
            failure = ChatError("HTTP 400", transient=False) if reply[1] == "fail" else None
            summary = text_response("They asked; it was done.", usage=(20, 3))
            self.clock += 1
            events, self.state = compaction_events(
                plan, self.state, summary, failure, [], now=self.clock
            )
            self.take(events)
            reply = ("text", "done")
        self.clock += 1
        events, self.state = end_poll(self.state, response(reply, self.state.seq), now=self.clock)
        self.take(events)
        # As the model-call driver logs it with the reply.
        asked = approval_request(self.state)
        if asked is not None:
            self.emit(asked)


def assert_same(tracker: Tracker, state: SessionState) -> None:
    assert tracker.unreadable is None
    assert tracker.state == state.status
    assert tracker.in_poll == state.in_poll
    assert tracker.pending == tuple(use.id for use in state.pending)
    assert tracker.returned == {result.tool_use_id for result in state.returned}
    assert tracker.queued == state.queued
    assert tracker.usage == state.usage
    assert tracker.stop_reason == state.stop_reason
    assert tracker.seq == state.seq
    awaiting = tuple(use for use in tracker.pending if use in tracker.awaiting)
    assert awaiting == tuple(use.id for use in awaiting_approval(state))


@given(steps, st.sampled_from([2, 4, 50]), st.booleans())
def test_the_light_fold_keeps_what_the_status_follows_from(
    plan: list[tuple[tuple[str, Any], str]], max_turns: int, loop_guard: bool
) -> None:
    guards = GuardConfig() if loop_guard else GuardConfig(loop=None, duplicates=None)
    session = Session(open_session(SPEC, session_id="s", max_turns=max_turns, guards=guards))
    session.poll(UserMessage("start"), ("text", "hello"))
    for reply, action in plan:
        state = session.state
        if state.status in ("cancelled", "failed"):
            break
        if session.tracker.errored:
            # A Host makes the failed call again; here, the reply comes on the retry.
            session.clock += 1
            events, session.state = end_poll(state, response(reply, state.seq), now=session.clock)
            session.take(events)
            continue
        if action == "cancel":
            session.emit(Cancelled(reason="cancelled by request"))
        elif action == "crash":
            session.emit(Failed(error="RuntimeError: boom"))
        elif action == "queue" and state.status != "requires_action":
            session.emit(MessageQueued(text="later"))
        elif state.status == "requires_action":
            for use in awaiting_approval(state):
                # "error" denies; any other action approves.
                session.emit(ApprovalDecided(use.id, approved=action != "error"))
            if action == "announce":
                session.emit(ToolCalled(state.pending[0].id, state.pending[0].name, {}))
            results = tuple(
                ToolResult(use.id, f"{use.name} gave {use.input}", action == "error")
                for use in state.pending
            )
            for result in results:
                session.emit(ToolReturned(result.tool_use_id, result.text, result.is_error))
            session.poll(Resume(session.state.pending, results), reply)
        elif not state.in_poll:
            text = "later" if state.queued else "more"
            session.poll(UserMessage(text), reply)


def test_a_session_opened_twice_or_not_at_first_is_unreadable() -> None:
    state = open_session(SPEC, session_id="s")
    events, state, _ = begin_poll(state, UserMessage("hi"), now=1.0)
    tracker = Tracker("s")
    for envelope in events:
        tracker.apply(envelope)
    tracker.apply(Envelope("s", 3, 2.0, events[0].event))
    assert tracker.status == "unreadable"
    summary = tracker.summary()
    assert summary.error is not None
    assert "seq 3 is local.session_opened" in summary.error
    assert summary.events == 3
    assert summary.last_at == 2.0

    headless = Tracker("t")
    headless.apply(Envelope("t", 1, 1.0, MessageReceived(text="hi")))
    assert headless.status == "unreadable"


def test_a_summary_says_what_the_list_shows() -> None:
    state = open_session(AgentSpec(model="m1"), session_id="s")
    events, state, _ = begin_poll(state, UserMessage("what  is\n2+3? " * 20), now=5.0)
    after, state = end_poll(state, text_response("5", usage=(11, 1)), now=6.5)
    tracker = Tracker("s")
    for envelope in [*events, *after]:
        tracker.apply(envelope)
    summary = tracker.summary()
    assert summary.status == "idle"
    assert summary.model == "m1"
    assert (summary.created_at, summary.last_at) == (5.0, 6.5)
    assert summary.polls == 1
    assert summary.usage == Usage(11, 1)
    assert summary.prompt is not None
    assert summary.prompt.startswith("what is 2+3? what is")
    assert len(summary.prompt) <= 120
    assert summary.stop_reason == "stop"
    assert summary.error is None
    tracker.apply(Envelope("s", state.seq + 1, 7.0, ChatFailed(error="down", transient=True)))
    assert tracker.summary().status == "errored"
    assert tracker.summary().error == "down"
