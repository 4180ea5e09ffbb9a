"""The model-call driver: the one place a poll's model call is made and its outcome turned
into events, for `poll_turn`, `run()` and the Host alike; and poll_turn, which advances
a session by exactly one model call.

A call is two steps, so that a caller may take a lock (the Host) or a model slot between
them: `call_model` awaits the chat backend, collecting what it reports meanwhile; then
`answer` applies the response with `end_poll`, or, when the call failed or the response is
malformed, gives the failure's events (`failure_events`). Each step reads the clock once,
when it makes its events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from turnkeeper.core import Chat, ChatError
from turnkeeper.events import AnyEvent, Envelope, TokenDelta
from turnkeeper.guards import Guard, default_guards
from turnkeeper.providers import DeltaSink, collecting_events, streaming_to
from turnkeeper.sessions._inputs import Input, Resume
from turnkeeper.sessions._poll import begin_poll, build_request, emit, end_poll, failure_events
from turnkeeper.state import SessionState, approval_request


class Called(msgspec.Struct, frozen=True, gc=False):
    """The outcome of one model call: the response (None if it failed), the ChatError it
    failed with, and the events the backend reported during it (retries, say).

    Structs, this and `Answer`, not NamedTuples: one of each per model call, and a Struct
    is made in a fifth of the time."""

    response: object
    failure: ChatError | None
    reported: list[AnyEvent]


class Answer(msgspec.Struct, frozen=True, gc=False):
    """What a model call logs: its events, the state they lead to, and its failure (None
    when the model answered)."""

    events: list[Envelope]
    state: SessionState
    failure: ChatError | None


async def call_model(
    chat: Chat, request: dict[str, Any], deltas: DeltaSink | None = None
) -> Called:
    """Send `request` to `chat`; a ChatError is the outcome's failure, not raised. With
    `deltas`, a backend that can stream sends the reply's fragments there as they come."""
    with collecting_events() as reported:
        try:
            if deltas is None:
                response = await chat(request)
            else:
                with streaming_to(deltas):
                    response = await chat(request)
        except ChatError as error:
            return Called(None, error, reported)
    return Called(response, None, reported)


def answer(
    called: Called,
    state: SessionState,
    *,
    guard: Guard,
    clock: Callable[[], float],
    failed_after: SessionState | None = None,
) -> Answer:
    """The events of the call's outcome after `state` (the poll's, awaiting the answer): the
    response applied with the after-response guards, or, if the call failed or its response
    is malformed, the backend's reports and `local.chat_error`, numbered after
    `failed_after` (default `state`), which then leads to that state with only its seq
    moved on."""
    failure = called.failure
    if failure is None:
        try:
            events, ended = end_poll(
                state, called.response, now=clock(), guard=guard, reported=called.reported
            )
        except ChatError as error:
            failure = error
        else:
            return Answer(*_asking_approval(events, ended), None)
    before = state if failed_after is None else failed_after
    failed = failure_events(before, failure, called.reported, at=clock(), response=called.response)
    return Answer(list(failed), _advance_seq(before, len(failed)), failure)


def _asking_approval(
    events: list[Envelope], state: SessionState
) -> tuple[list[Envelope], SessionState]:
    """`events` and `state`, with the `local.approval_requested` after them that the calls
    of the reply need, if any (logged with the reply, so no one sees those calls waiting
    for results before they are approved)."""
    asked = approval_request(state)
    if asked is None:
        return events, state
    envelope, state = emit(state, asked, at=events[-1].at)
    return [*events, envelope], state


def _advance_seq(state: SessionState, count: int) -> SessionState:
    """The state after `count` events that change nothing but the seq."""
    return msgspec.structs.replace(state, seq=state.seq + count)


async def poll_turn(
    state: SessionState,
    input: Input,
    chat: Chat,
    *,
    guard: Guard = default_guards,
    clock: Callable[[], float] = time.time,
    on_delta: Callable[[TokenDelta], object] | None = None,
) -> tuple[tuple[Envelope, ...], SessionState]:
    """Advance the session by one model call: apply `input`, run the guards, call `chat`.

    Returns the poll's events and the new state. When the model call fails, raises
    ChatError with `events` to log; the given state stays valid (retry the poll).
    A state rebuilt in the middle of a poll (`in_poll`) is finished by `Resume()`:
    the model call is made again, without applying any input. With `on_delta`, the call
    is streamed: `on_delta` gets the reply's fragments as they come (see `run`).
    """
    events: list[Envelope] = []
    request: dict[str, Any] | None
    if state.in_poll and isinstance(input, Resume) and not input.results:
        begun, request = state, build_request(state)
    else:
        events, begun, request = begin_poll(state, input, now=clock(), guard=guard)
    if request is None:
        return tuple(events), begun
    sink = None if on_delta is None else DeltaSink(on_delta, begun.session_id, begun.seq)
    answered = answer(
        await call_model(chat, request, sink), begun, guard=guard, clock=clock, failed_after=state
    )
    if answered.failure is not None:
        answered.failure.events = tuple(answered.events)
        raise answered.failure
    return (*events, *answered.events), answered.state
