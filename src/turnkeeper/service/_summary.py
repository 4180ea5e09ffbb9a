"""What the session list shows of a session, folded from its events alone: its status as
a Host gives it, when it was created and last active, its model calls and tokens.

A fold of its own, much lighter than `turnkeeper.state.fold` (no history, no guard
memory), so that an index of 100,000 sessions stays in memory: it keeps of the state
only what the status follows from, by the same rules (tests/service/test_summary.py
holds it to the real fold, event by event). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

import msgspec

from turnkeeper.core import InputError, SeqError, Usage, decode_tool_uses, gist
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    ApprovalDecided,
    ApprovalRequested,
    Cancelled,
    ChatFailed,
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
    SessionOpened,
    TerminalToolCalled,
    ToolCalled,
    ToolResultsReceived,
    ToolReturned,
)
from turnkeeper.sessions import HostStatus, Status
from turnkeeper.state import initial_state

ListedStatus = HostStatus
"""A Host's statuses, `unreadable` among them: a session whose events do not make one."""

LISTED_STATUSES: tuple[ListedStatus, ...] = get_args(HostStatus)

_PROMPT_CHARS = 120


class SessionSummary(msgspec.Struct, frozen=True):
    """A session as its log tells it. `status` is the one a Host gives it (but for the
    moments its log cannot tell: a call of a tool the Host runs itself, before the call
    is logged, shows as `requires_action`; a `retry` of an errored session shows once its
    call is). `created_at` and `last_at` are the times of its first and last events (Unix
    seconds); `events` is its last seq; `polls` its model calls; `prompt` its first user
    message, cut short; `error` why it errored, failed or is unreadable."""

    session_id: str
    status: ListedStatus
    model: str
    created_at: float
    last_at: float
    events: int
    polls: int
    usage: Usage
    prompt: str | None
    stop_reason: str | None
    error: str | None


class Tracker:
    """One session's summary, advanced one event at a time (`apply`)."""

    __slots__ = (
        "awaiting",
        "called",
        "created_at",
        "error",
        "errored",
        "in_poll",
        "last_at",
        "model",
        "pending",
        "polls",
        "prompt",
        "queued",
        "returned",
        "seq",
        "session_id",
        "state",
        "stop_reason",
        "unreadable",
        "usage",
    )

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.state: Status = "idle"
        self.in_poll = False
        self.pending: tuple[str, ...] = ()
        # Of the pending calls: the ones answered (`local.tool_result`), the ones a Host's
        # own handler runs (`local.tool_call`). Neither waits on anyone outside.
        self.returned: frozenset[str] = frozenset()
        self.called: frozenset[str] = frozenset()
        # Of the pending calls: those awaiting approval (a denied one is answered by the
        # Host, so it counts as called).
        self.awaiting: frozenset[str] = frozenset()
        self.queued: tuple[str, ...] = ()
        self.errored = False
        self.error: str | None = None
        self.unreadable: str | None = None
        self.model = ""
        self.created_at = 0.0
        self.last_at = 0.0
        self.seq = 0
        self.polls = 0
        self.usage = Usage()
        self.prompt: str | None = None
        self.stop_reason: str | None = None

    @property
    def status(self) -> ListedStatus:
        """The status a Host gives the session (its `_status`, from the log)."""
        state = self.state
        if self.unreadable is not None:
            return "unreadable"
        if state in ("failed", "cancelled"):
            return state
        if self.errored:
            return "errored"
        if self.in_poll or state == "running":
            return "running"
        if state == "requires_action":
            if self.awaiting and any(use in self.awaiting for use in self.pending):
                return "awaiting_approval"
            waiting = any(
                use not in self.returned and use not in self.called for use in self.pending
            )
            return "requires_action" if waiting else "running"
        if self.queued:
            return "running"
        return "halted" if state == "halted" else "idle"

    def summary(self) -> SessionSummary:
        status = self.status
        error = self.unreadable if status == "unreadable" else self.error
        return SessionSummary(
            session_id=self.session_id,
            status=status,
            model=self.model,
            created_at=self.created_at,
            last_at=self.last_at,
            events=self.seq,
            polls=self.polls,
            usage=self.usage,
            prompt=self.prompt,
            stop_reason=self.stop_reason,
            error=error if status in ("errored", "failed", "unreadable") else None,
        )

    def apply(self, envelope: Envelope) -> None:
        """Advance the summary by the session's next event."""
        if envelope.seq != self.seq + 1 and self.unreadable is None:
            # A row lost from the log: the session cannot be rebuilt, as a Host would find.
            self.unreadable = str(SeqError(self.session_id, envelope.seq, self.seq + 1))
        if self.seq == 0:
            self.created_at = envelope.at
        self.seq = envelope.seq
        self.last_at = envelope.at
        event = envelope.event
        kind = type(event)
        # As a Host rebuilt from the log sees it: errored while a failed call is the last word.
        self.errored = kind is ChatFailed
        self.error = event.error if isinstance(event, ChatFailed | Failed) else None
        if self.unreadable is not None:
            return
        if (kind is SessionOpened) != (envelope.seq == 1):
            self.unreadable = (
                f"seq {envelope.seq} is {envelope.type}; a session's log starts with "
                "local.session_opened, and only there"
            )
            return
        rule = _RULES.get(kind)
        if rule is None:
            return
        try:
            rule(self, event)
        except (InputError, TypeError) as exc:
            self.unreadable = f"seq {envelope.seq}: {exc}"

    # The rules of turnkeeper.state's fold, for the fields the status follows from.

    def _opened(self, event: SessionOpened) -> None:
        self.model = event.spec.model
        if all(message.get("role") == "system" for message in event.history):
            # A new session (the usual case): nothing of a transcript to take up.
            self.state, self.pending = "idle", ()
            return
        opened = initial_state(self.session_id, event)
        self.state = opened.status
        self.pending = tuple(use.id for use in opened.pending)

    def _message(self, event: MessageReceived) -> None:
        if self.prompt is None:
            self.prompt = gist(event.text, _PROMPT_CHARS)
        if self.queued and self.queued[0] == event.text:
            self.queued = self.queued[1:]
        self._begin_step()

    def _results(self, event: ToolResultsReceived) -> None:
        self._begin_step()

    def _begin_step(self) -> None:
        """A poll's input: the model is to be called."""
        self.pending = ()
        self.returned = self.called = self.awaiting = frozenset()
        self.state = "running"
        self.in_poll = True
        self.stop_reason = None

    def _response(self, event: ModelResponded) -> None:
        self.pending = _call_ids(event)
        self.returned = self.called = self.awaiting = frozenset()
        self.state = "requires_action" if self.pending else "idle"
        self.in_poll = False
        self.polls += 1
        self.usage += event.usage
        self.stop_reason = "tool_use" if self.pending else event.finish_reason or "unknown"

    def _compacted(self, event: Compacted | CompactionFailed) -> None:
        self.usage += event.usage

    def _queued(self, event: MessageQueued) -> None:
        self.queued = (*self.queued, event.text)

    def _directive(self, event: DirectiveInjected) -> None:
        if self.state == "idle":
            self.state = "running"
        self.stop_reason = None

    def _duplicate(self, event: DuplicateToolCall) -> None:
        self.pending = tuple(use for use in self.pending if use != event.tool_call_id)
        if not self.pending and self.state == "requires_action":
            self.state = "running"

    def _returned(self, event: ToolReturned) -> None:
        if event.tool_call_id in self.pending:
            self.returned |= {event.tool_call_id}

    def _called(self, event: ToolCalled) -> None:
        self.called |= {event.tool_call_id}

    def _approval_requested(self, event: ApprovalRequested) -> None:
        self.awaiting |= {call for call in event.tool_call_ids if call in self.pending}

    def _approval_decided(self, event: ApprovalDecided) -> None:
        call = event.tool_call_id
        if call in self.awaiting:
            self.awaiting -= {call}
            if not event.approved:
                self.called |= {call}

    def _halted(self, event: Halted) -> None:
        self.pending, self.in_poll = (), False
        self.state, self.stop_reason = "halted", event.reason

    def _answer_requested(self, event: AnswerRequested) -> None:
        self._begin_step()

    def _answered(self, event: AnsweredAfterStop) -> None:
        self.pending, self.in_poll = (), False
        self.state, self.stop_reason = "idle", "end_turn"

    def _terminal(self, event: TerminalToolCalled) -> None:
        self.pending, self.in_poll = (), False
        self.state, self.stop_reason = "idle", "terminal_tool"

    def _cancelled(self, event: Cancelled) -> None:
        self.pending, self.in_poll = (), False
        self.state, self.stop_reason = "cancelled", "cancelled"

    def _failed(self, event: Failed) -> None:
        self.in_poll = False
        self.state, self.stop_reason = "failed", "failed"


_RULES: dict[type, Callable[[Tracker, Any], None]] = {
    SessionOpened: Tracker._opened,
    MessageReceived: Tracker._message,
    ToolResultsReceived: Tracker._results,
    ModelResponded: Tracker._response,
    Compacted: Tracker._compacted,
    CompactionFailed: Tracker._compacted,
    MessageQueued: Tracker._queued,
    DirectiveInjected: Tracker._directive,
    DuplicateToolCall: Tracker._duplicate,
    ToolReturned: Tracker._returned,
    ToolCalled: Tracker._called,
    ApprovalRequested: Tracker._approval_requested,
    ApprovalDecided: Tracker._approval_decided,
    Halted: Tracker._halted,
    AnswerRequested: Tracker._answer_requested,
    AnsweredAfterStop: Tracker._answered,
    TerminalToolCalled: Tracker._terminal,
    Cancelled: Tracker._cancelled,
    Failed: Tracker._failed,
}
"""How each kind of event changes a summary's status; the others change only its seq
and times (and end an error)."""


def _call_ids(event: ModelResponded) -> tuple[str, ...]:
    """The ids of the reply's tool calls; TypeError if they are malformed, as the fold's
    `decode_tool_uses` says (whose decoding of each call's arguments is skipped here)."""
    calls = event.message.get("tool_calls")
    if not calls:
        return ()
    if isinstance(calls, list | tuple) and all(map(_well_formed, calls)):
        return tuple(call["id"] for call in calls)
    return tuple(use.id for use in decode_tool_uses(event.message))


def _well_formed(call: object) -> bool:
    """Whether a tool call has a string id and a function with a string name."""
    function = call.get("function") if isinstance(call, dict) else None
    return (
        isinstance(call, dict)
        and isinstance(call.get("id"), str)
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
    )
