"""recheck: re-derive a logged session's guard events from its logged inputs and responses.

With the session's own guard configuration this is a determinism check (it must
find no divergence); with another configuration it answers "what would these
guards have done", without calling any model.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from turnkeeper.core import ChatError, GuardConfig, InputError, ReplayError, check_guards
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    AnyEvent,
    ChatFailed,
    ChatRetried,
    Compacted,
    CompactionFailed,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Forked,
    Halted,
    MessageQueued,
    MessageReceived,
    ModelResponded,
    OutputAccepted,
    ReplyReplaced,
    SessionOpened,
    TerminalToolCalled,
    ToolResultsReceived,
)
from turnkeeper.guards import Guard, default_guards
from turnkeeper.sessions._inputs import Input, Resume, UserMessage
from turnkeeper.sessions._open import check_guards_of
from turnkeeper.sessions._poll import begin_poll, end_poll
from turnkeeper.sessions._run import RUNNER_HALTS
from turnkeeper.state import SessionState, apply_event, initial_state, replay, whole_results


class Divergence(msgspec.Struct, frozen=True):
    """The first poll where the guards' events differ from the log's, at the step of it at
    `seq`: the poll's input or the model's response. `logged` and `derived` are that step
    and the guard events after it."""

    poll: int
    seq: int
    summary: str
    logged: tuple[AnyEvent, ...]
    derived: tuple[AnyEvent, ...]


def recheck(
    events: Sequence[Envelope],
    *,
    guards: GuardConfig | None = None,
    guard: Guard = default_guards,
) -> Divergence | None:
    """The first poll where `guard` under `guards` (default: the logged configuration)
    would have produced other guard events than the log holds, or None if it agrees
    throughout.

    At each poll the guard events re-derived after its input, and again after the model's
    response, are compared with all the guard events the log holds there. A poll whose
    model call has no response in the log (the call failed, the session was cancelled or
    failed, the run stopped, or the log ends) is left there: the guards had no say in it.
    Raises InputError if `guards` sets a guard otherwise than the log does, out of range.
    """
    if not events or not isinstance(events[0].event, SessionOpened):
        raise ReplayError("recheck needs a session's log from its local.session_opened")
    opening = events[0]
    assert isinstance(opening.event, SessionOpened)
    state: SessionState = initial_state(opening.session_id, opening.event)
    if guards is not None:
        check_guards(guards, since=opening.event.guards)
        check_guards_of(opening.event.spec, guards)
        state = msgspec.structs.replace(state, guards=guards)
    state = msgspec.structs.replace(state, seq=1)
    index, poll = 1, 0
    while index < len(events):
        envelope = events[index]
        event = envelope.event
        if not isinstance(event, MessageReceived | ToolResultsReceived):
            state = apply_event(state, envelope)
            index += 1
            continue
        poll += 1
        try:
            derived, begun, request = begin_poll(
                state, _input_of(state, event), now=envelope.at, guard=guard
            )
        except InputError as exc:
            return Divergence(
                poll, envelope.seq, f"poll {poll}: the logged input is refused: {exc}", (event,), ()
            )
        end, divergence = _compare(events, index, derived, poll, guard)
        if divergence is not None:
            return divergence
        index, state = end, begun
        # The poll's model call, then, when a guard turned a stop after its response into
        # an answer after the stop, that answer's call.
        calling = request is not None
        while calling:
            # What may be logged while the model call is in flight: retries, failures (a
            # Host makes the call again), messages queued for later, a fork's start (a
            # fork of a session in the middle of its call makes the call), and a summary
            # of older turns made before the call (a model call of its own, not re-made).
            while index < len(events) and isinstance(
                events[index].event,
                ChatRetried | ChatFailed | MessageQueued | Forked | Compacted | CompactionFailed,
            ):
                state = apply_event(state, events[index])
                index += 1
            if index == len(events) or not isinstance(events[index].event, ModelResponded):
                break
            after, ended = _end(state, events[index], guard)
            end, divergence = _compare(events, index, after, poll, guard)
            if divergence is not None:
                return divergence
            index, state = end, ended
            calling = state.answering is not None and state.in_poll
    return None


def _input_of(state: SessionState, event: MessageReceived | ToolResultsReceived) -> Input:
    """The input of a poll, from its logged event."""
    if isinstance(event, MessageReceived):
        return UserMessage(event.text)
    where = f"session {state.session_id}: seq {state.seq + 1}"
    return Resume(state.pending, whole_results(state.returned, event, where))


def _end(
    state: SessionState, response: Envelope, guard: Guard
) -> tuple[list[Envelope], SessionState]:
    """The events `end_poll` derives for the logged `response`, and the state they lead to."""
    logged = response.event
    assert isinstance(logged, ModelResponded)
    try:
        after, ended = end_poll(
            state, msgspec.json.decode(logged.response), now=response.at, guard=guard
        )
    except ChatError as exc:
        # No live poll logs such a response: the log was written by other means.
        raise ReplayError(f"session {response.session_id}: seq {response.seq}: {exc}") from None
    # The response is the log's, byte for byte: end_poll encodes it again, and a log
    # written elsewhere may spell the same JSON differently.
    first = after[0]
    assert isinstance(first.event, ModelResponded)
    after[0] = msgspec.structs.replace(
        first, event=msgspec.structs.replace(first.event, response=logged.response)
    )
    return after, ended


def by_guards(event: AnyEvent) -> bool:
    """Whether `event` is one the guards derive (a halt a run logs itself is not)."""
    if isinstance(event, Halted):
        return event.guard not in RUNNER_HALTS
    return isinstance(
        event,
        DirectiveInjected
        | DuplicateToolCall
        | ReplyReplaced
        | TerminalToolCalled
        | AnswerRequested
        | AnsweredAfterStop
        | OutputAccepted,
    )


def _compare(
    events: Sequence[Envelope], start: int, derived: Sequence[Envelope], poll: int, guard: Guard
) -> tuple[int, Divergence | None]:
    """Compare the step at `start` (a poll's input or the model's response) and every guard
    event the log holds after it with `derived`. Returns the index after the logged step,
    and the divergence if they differ."""
    end = start + 1
    while end < len(events) and by_guards(events[end].event):
        end += 1
    logged = [envelope.event for envelope in events[start:end]]
    now = [envelope.event for envelope in derived]
    if end == len(events):
        # The log may end partway through the step's events (a process stopped between
        # two appends): the rest is what the log's own guards derive there.
        own = _own(events, start, guard)
        if len(logged) < len(own) and own[: len(logged)] == logged:
            logged = own
    if logged == now:
        return end, None
    return end, _diverged(poll, events[start], logged, now)


def _own(events: Sequence[Envelope], start: int, guard: Guard) -> list[AnyEvent]:
    """The events the log's own guard configuration derives for the step at `start`."""
    state = replay(events[:start])
    step = events[start]
    event = step.event
    if isinstance(event, ModelResponded):
        derived, _ = _end(state, step, guard)
    else:
        assert isinstance(event, MessageReceived | ToolResultsReceived)
        derived, _, _ = begin_poll(state, _input_of(state, event), now=step.at, guard=guard)
    return [envelope.event for envelope in derived]


def _describe(events: Sequence[AnyEvent]) -> str:
    """What the guards do in a step's events, in words."""
    done: list[str] = []
    repeated = [event.name for event in events if isinstance(event, DuplicateToolCall)]
    if repeated:
        done.append("self-answer the repeated call of " + " and ".join(dict.fromkeys(repeated)))
    directives = sorted({event.guard for event in events if isinstance(event, DirectiveInjected)})
    if directives:
        done.append("add a directive from " + " and ".join(directives))
    for event in events:
        if isinstance(event, Halted):
            done.append(f"halt: {event.reason}")
        elif isinstance(event, TerminalToolCalled):
            done.append(f"finish with {event.name}")
        elif isinstance(event, ReplyReplaced):
            done.append(f"replace the model's reply ({event.guard})")
        elif isinstance(event, AnswerRequested):
            done.append(f"ask for an answer without tools after {event.guard} ({event.reason})")
        elif isinstance(event, AnsweredAfterStop):
            done.append("take the reply as the answer")
        elif isinstance(event, OutputAccepted):
            done.append("take the answer as the typed output")
    if done:
        return ", then ".join(done)
    if events and isinstance(events[0], ModelResponded):
        return "let the model's reply stand"
    return "call the model"


def _diverged(
    poll: int, step: Envelope, logged: Sequence[AnyEvent], derived: Sequence[AnyEvent]
) -> Divergence:
    then, now = _describe(logged), _describe(derived)
    halt = next((event for event in derived if isinstance(event, Halted)), None)
    doing = f"halt at poll {poll}: {halt.reason}" if halt else f"{now} at poll {poll}"
    if then != now:
        summary = f"would {doing} (the log shows: {then})"
    else:
        summary = f"would {doing} as the log shows, but {_difference(logged, derived)}"
    return Divergence(poll, step.seq, summary, tuple(logged), tuple(derived))


def _tag(event: AnyEvent) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _difference(logged: Sequence[AnyEvent], derived: Sequence[AnyEvent]) -> str:
    """How two lists of events that read alike differ."""
    for then, now in zip(logged, derived, strict=False):
        if then == now:
            continue
        if type(then) is not type(now):
            return f"the log holds {_tag(then)} where the guards derive {_tag(now)}"
        fields = [
            name
            for name in type(then).__struct_fields__
            if getattr(then, name) != getattr(now, name)
        ]
        return f"its {_tag(then)} differs in {', '.join(fields)}"
    return f"the log holds {len(logged)} events there and the guards derive {len(derived)}"
