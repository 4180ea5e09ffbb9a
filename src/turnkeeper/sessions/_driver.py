"""The model-call driver: the one place a poll's model call is made and its outcome turned
into events, for `poll_turn`, `run()` and the Host alike; and poll_turn, which advances
a session by exactly one model call.

A call is two steps, so that a caller may take a lock (the Host) or a model slot between
them: `call_model` awaits the chat backend, collecting what it reports meanwhile; then
`answer` applies the response with `end_poll`, or, when the call failed or the response is
malformed, gives the failure's events (`failure_events`). Each step reads the clock once,
when it makes its events.

Before a poll's model call, `plan_compaction` asks whether the history is past the spec's
compaction budget (the backend estimates its tokens); when it is, the summary of its older
turns is a model call of its own, made the same way (`call_model`), whose outcome
`compacted` turns into events (`compact` does all three).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from turnkeeper.core import Chat, ChatError, context_window, estimate_tokens
from turnkeeper.events import AnyEvent, Envelope, TokenDelta
from turnkeeper.guards import Guard, default_guards
from turnkeeper.providers import DeltaSink, collecting_events, streaming_to
from turnkeeper.sessions._compaction import (
    Plan,
    Transcript,
    compaction_events,
    older_turns,
    summary_request,
    transcript,
)
from turnkeeper.sessions._inputs import Input, Resume
from turnkeeper.sessions._poll import (
    begin_poll,
    build_request,
    emit,
    end_poll,
    failure_events,
    prompt_messages,
)
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
    chat: Chat,
    request: dict[str, Any],
    deltas: DeltaSink | None = None,
    reported: list[AnyEvent] | None = None,
) -> Called:
    """Send `request` to `chat`; a ChatError is the outcome's failure, not raised. With
    `deltas`, a backend that can stream sends the reply's fragments there as they come.
    What the backend reports meanwhile goes to `reported` (a new list by default), which
    a caller keeps if the call may be cut short."""
    with collecting_events(reported) as reported:
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
            return Answer(*asking_approval(events, ended), None)
    before = state if failed_after is None else failed_after
    failed = failure_events(before, failure, called.reported, at=clock(), response=called.response)
    return Answer(list(failed), _advance_seq(before, len(failed)), failure)


def compaction_budget(chat: Chat, state: SessionState) -> int | None:
    """The tokens the state's history may hold before its model call compacts it, or None
    when no compaction can be due: the spec's `compaction` is off, a summary failed in this
    episode, or no budget is known (`budget_tokens`, else half of `chat`'s context window)."""
    compaction = state.spec.compaction
    if compaction is None or state.compaction_failed:
        return None
    if compaction.budget_tokens is not None:
        return compaction.budget_tokens
    window = context_window(chat)
    return None if window is None else window // 2


async def plan_compaction(chat: Chat, state: SessionState) -> Plan | None:
    """The compaction due before the state's model call, or None: the spec's `compaction`
    is on, no summary failed in this episode, the history's tokens as `chat` estimates them
    are past the budget (`budget_tokens`, else half of `chat`'s context window; none
    known, no compaction), and its older turns hold more than twice `summary_tokens`."""
    compaction = state.spec.compaction
    budget = compaction_budget(chat, state)
    if compaction is None or budget is None:
        return None
    window = context_window(chat)
    estimated = await estimate_tokens(chat, prompt_messages(state))
    if estimated <= budget:
        return None
    start, end, kept = older_turns(state, compaction.keep_recent_turns)
    plan = Plan(state.history, start, end, kept, estimated, budget, {})
    older = plan.older()
    if not older or await estimate_tokens(chat, older) <= 2 * compaction.summary_tokens:
        return None
    # The summary call may take the window, but for its reply and a quarter kept for what
    # an estimate misses (a chat template's tokens); of a window not known, the budget.
    room = budget if window is None else (window - compaction.summary_tokens) * 3 // 4
    # The transcript holds the request kept too: what the turns were for.
    lines = transcript(list(state.history[start:end]), frozenset(i - start for i in kept))
    request = await _summary_request(chat, state, lines, room)
    return msgspec.structs.replace(plan, request=request)


async def _summary_request(
    chat: Chat, state: SessionState, lines: Transcript, room: int
) -> dict[str, Any]:
    """The summary request, the fewest of its transcript's oldest lines left out that make
    its messages fit `room` tokens as `chat` estimates them (all that may go, if even that
    is not enough: the call then fails as too long, and says so)."""

    async def fits(dropped: int) -> bool:
        messages = summary_request(state, lines.text(dropped))["messages"]
        return await estimate_tokens(chat, messages) <= room

    if await fits(0):
        return summary_request(state, lines.text(0))
    # Fewer lines never count more tokens.
    low, high = 1, lines.droppable
    while low < high:
        middle = (low + high) // 2
        if await fits(middle):
            high = middle
        else:
            low = middle + 1
    return summary_request(state, lines.text(high))


def compacted(
    called: Called, plan: Plan, state: SessionState, *, clock: Callable[[], float]
) -> tuple[list[Envelope], SessionState]:
    """The events of the summary call's outcome after `state` (see `compaction_events`),
    and the state they lead to."""
    return compaction_events(
        plan, state, called.response, called.failure, called.reported, now=clock()
    )


async def compact(
    chat: Chat, state: SessionState, *, clock: Callable[[], float]
) -> tuple[list[Envelope], SessionState]:
    """Summarise the state's older turns if a compaction is due (`plan_compaction`): the
    events of the summary call and the state they lead to; none and `state` if not due."""
    plan = await plan_compaction(chat, state)
    if plan is None:
        return [], state
    return compacted(await call_model(chat, plan.request), plan, state, clock=clock)


def asking_approval(
    events: list[Envelope], state: SessionState
) -> tuple[list[Envelope], SessionState]:
    """`events` and `state`, with the `local.approval_requested` after them that the calls
    of the reply need, if any: logged with the reply (or a fork of it), so no one sees
    those calls waiting for results before they are approved."""
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
    ChatError with `events` to log; the given state stays valid (retry the poll; a
    compaction made before the call is made again then). A state rebuilt in the middle of
    a poll (`in_poll`) is finished by `Resume()`: the model call is made again, without
    applying any input. With `on_delta`, the call is streamed: `on_delta` gets the reply's
    fragments as they come (see `run`).
    """
    events: list[Envelope] = []
    request: dict[str, Any] | None
    if state.in_poll and isinstance(input, Resume) and not input.results:
        begun, request = state, build_request(state)
    else:
        events, begun, request = begin_poll(state, input, now=clock(), guard=guard)
    if request is None:
        return tuple(events), begun
    compaction: list[Envelope] = []
    # Checked here first: most polls have no compaction due, nor need the awaits to see it.
    if compaction_budget(chat, begun) is not None:
        compaction, begun = await compact(chat, begun, clock=clock)
        if compaction:
            request = build_request(begun)
    sink = None if on_delta is None else DeltaSink(on_delta, begun.session_id, begun.seq)
    answered = answer(
        await call_model(chat, request, sink), begun, guard=guard, clock=clock, failed_after=state
    )
    if answered.failure is not None:
        answered.failure.events = tuple(answered.events)
        raise answered.failure
    return (*events, *compaction, *answered.events), answered.state
