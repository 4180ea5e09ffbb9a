"""recheck: re-derive a logged session's guard events from its logged inputs and responses.

With the session's own guard configuration this is a determinism check (it must
find no divergence); with another configuration it answers "what would these
guards have done", without calling any model.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from turnkeeper.events import (
    AnyEvent,
    ChatError,
    ChatFailed,
    ChatRetried,
    DirectiveInjected,
    Envelope,
    GuardConfig,
    Halted,
    InputError,
    MessageQueued,
    MessageReceived,
    ModelResponded,
    ReplayError,
    SessionOpened,
    SessionState,
    TerminalToolCalled,
    ToolResultsReceived,
    Usage,
    apply_event,
    initial_state,
)
from turnkeeper.guards import Guard, default_guards
from turnkeeper.sessions._inputs import Input, Resume, UserMessage
from turnkeeper.sessions._poll import begin_poll, end_poll


class Divergence(msgspec.Struct, frozen=True):
    """The first poll where the guards' events differ from the log's."""

    poll: int
    seq: int
    summary: str
    logged: tuple[AnyEvent, ...]
    derived: tuple[AnyEvent, ...]


def _describe(events: Sequence[AnyEvent]) -> str:
    for event in events:
        if isinstance(event, Halted):
            return f"halt: {event.reason}"
        if isinstance(event, TerminalToolCalled):
            return f"finish with {event.name}"
    directives = [event for event in events if isinstance(event, DirectiveInjected)]
    if directives:
        return "add a directive from " + " and ".join(sorted({d.guard for d in directives}))
    if any(isinstance(event, ModelResponded) for event in events):
        return "call the model"
    return "do nothing"


def _diverged(
    poll: int, seq: int, logged: Sequence[AnyEvent], derived: Sequence[AnyEvent]
) -> Divergence:
    then, now = _describe(logged), _describe(derived)
    if now.startswith("halt: "):
        summary = f"would halt at poll {poll}: {now[6:]} (the log shows: {then})"
    else:
        summary = f"would {now} at poll {poll} (the log shows: {then})"
    return Divergence(poll, seq, summary, tuple(logged), tuple(derived))


def recheck(
    events: Sequence[Envelope],
    *,
    guards: GuardConfig | None = None,
    guard: Guard = default_guards,
) -> Divergence | None:
    """The first poll where `guard` under `guards` (default: the logged configuration)
    would have produced other events than the log holds, or None if it agrees throughout."""
    if not events or not isinstance(events[0].event, SessionOpened):
        raise ReplayError("recheck needs a session's log from its local.session_opened")
    first = events[0]
    assert isinstance(first.event, SessionOpened)
    state: SessionState = initial_state(first.session_id, first.event)
    if guards is not None:
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
        given: Input = (
            UserMessage(event.text)
            if isinstance(event, MessageReceived)
            else Resume(state.pending, event.results)
        )
        try:
            derived, begun, request = begin_poll(state, given, now=envelope.at, guard=guard)
        except InputError as exc:
            return Divergence(
                poll, envelope.seq, f"poll {poll}: the logged input is refused: {exc}", (event,), ()
            )
        matched = _match(events, index, derived)
        if matched is not None:
            return _diverged(poll, envelope.seq, matched, [e.event for e in derived])
        index += len(derived)
        state = begun
        if request is None:
            continue
        # What may be logged while the model call is in flight: retries, a failure, and
        # messages queued for later.
        while index < len(events) and isinstance(
            events[index].event, ChatRetried | ChatFailed | MessageQueued
        ):
            state = apply_event(state, events[index])
            index += 1
        response = events[index] if index < len(events) else None
        if response is None or not isinstance(response.event, ModelResponded):
            logged = [e.event for e in events[index : index + 1]]
            return _diverged(poll, envelope.seq, logged, [_MODEL_CALL])
        logged_response = response.event.response
        try:
            after, ended = end_poll(
                state, msgspec.json.decode(logged_response), now=response.at, guard=guard
            )
        except ChatError as exc:
            # No live poll logs such a response: the log was written by other means.
            raise ReplayError(f"session {response.session_id}: seq {response.seq}: {exc}") from None
        # The response is the log's, byte for byte: end_poll encodes it again, and a log
        # written elsewhere may spell the same JSON differently.
        first = after[0]
        assert isinstance(first.event, ModelResponded)
        after[0] = msgspec.structs.replace(
            first, event=msgspec.structs.replace(first.event, response=logged_response)
        )
        matched = _match(events, index, after)
        if matched is not None:
            return _diverged(poll, envelope.seq, matched, [e.event for e in after])
        index += len(after)
        state = ended
    return None


_MODEL_CALL = ModelResponded(
    response=msgspec.Raw(b"{}"), message={"role": "assistant"}, finish_reason=None, usage=Usage()
)
"""Stands for "the guards would call the model here" in a divergence."""


def _match(
    events: Sequence[Envelope], start: int, derived: Sequence[Envelope]
) -> list[AnyEvent] | None:
    """None if the log holds `derived`'s events from `start`, else the logged events there."""
    logged = [e.event for e in events[start : start + len(derived)]]
    if logged == [e.event for e in derived]:
        return None
    return logged
