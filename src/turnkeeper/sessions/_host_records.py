"""The host's record of each session, the statuses it reports, and its errors."""

from __future__ import annotations

from typing import Any, Literal

import anyio
import anyio.abc
import msgspec

from turnkeeper.core import ToolUse, TurnkeeperError, Usage, last_answer
from turnkeeper.events import ChatFailed, Envelope, Failed
from turnkeeper.sessions._driver import Called
from turnkeeper.state import PackedState, SessionState, denial, pack_state, unpack_state
from turnkeeper.tools import McpTools, check_call
from turnkeeper.tracing import AgentSpan

HostStatus = Literal[
    "running",
    "requires_action",
    "awaiting_approval",
    "idle",
    "errored",
    "halted",
    "failed",
    "cancelled",
    "unreadable",
]
"""running: working (or about to). requires_action: waits for tool results from outside.
awaiting_approval: tool calls wait for a decision (`Host.approve`) before any runs. idle:
the turn ended, waits for a message. errored: the model stayed unreachable after retries
(`retry` or a new message resumes it). halted: a guard stopped it. failed: it
crashed too often. cancelled: cancelled from outside. unreadable: its events in the log
cannot be rebuilt into a session (no events, a gap, a damaged row); the host leaves it
alone (quarantined) and `error` says why."""


class Busy(TurnkeeperError):
    """A session's mailbox is full; try again later."""


class UnknownSession(TurnkeeperError, LookupError):
    """No session has this id."""


class SessionUnreadable(UnknownSession):
    """The log holds the session, but its events cannot be rebuilt into one (it is
    quarantined: status "unreadable"); `reason` says why."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id} cannot be rebuilt from the log: {reason}")
        self.session_id = session_id
        self.reason = reason


class HostStopped(TurnkeeperError):
    """The host is stopping or stopped and takes no new work."""


class SessionInfo(msgspec.Struct, frozen=True):
    """A session as the host sees it now. `pending` are the tool calls waiting for results
    from outside; `awaiting` the calls waiting for approval (`Host.approve`); `text` is
    the model's last answer or why the session stopped; `output` the typed output of a
    spec with an `output_schema` (the answer's JSON value, or an instance of the type
    given to `start` as the schema)."""

    session_id: str
    status: HostStatus
    pending: tuple[ToolUse, ...]
    stop_reason: str | None
    text: str | None
    result: dict[str, Any] | None
    usage: Usage
    polls: int
    seq: int
    queued: int
    error: str | None
    awaiting: tuple[ToolUse, ...] = ()
    output: Any = None


class SessionLock:
    """A session's lock, held around each change to its record (its task's commits, the
    API's): taken with no checkpoint when free, as anyio's `Lock(fast_acquire=True)`, and
    handed to the longest waiter when one waits.

    A Host holds one per session, thousands at once, and takes it twice a turn: free, it
    costs a flag and no objects (an anyio Lock on trio is four objects and an ordered dict,
    about 500 bytes); each waiter parks on an event of its own, made only then.
    """

    __slots__ = ("_waiting", "locked")

    def __init__(self) -> None:
        self.locked = False
        # The waiters' events, oldest first; None until the first waits.
        self._waiting: dict[anyio.Event, None] | None = None

    async def __aenter__(self) -> None:
        if not self.locked:
            self.locked = True
            return
        granted = anyio.Event()
        if self._waiting is None:
            self._waiting = {}
        self._waiting[granted] = None
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():
                # Handed the lock as the wait was cancelled: the next waiter gets it.
                self._release()
            else:
                del self._waiting[granted]
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._release()

    def _release(self) -> None:
        waiting = self._waiting
        if waiting:
            granted = next(iter(waiting))
            del waiting[granted]
            # Still locked: the waiter holds it now.
            granted.set()
        else:
            self.locked = False


class _Session:
    """The host's record of one session; the mailbox outlives the session's task.

    At rest its state is packed (`rest`), and unpacked by the next read of `state`."""

    # Slots: past 30 attributes an instance's dict stops sharing its keys with the others
    # (CPython), and a record would take 1.5 KB more.
    __slots__ = (
        "_answer",
        "_state",
        "announced",
        "appending",
        "backing_off",
        "cancelling",
        "changed",
        "checked",
        "contexts",
        "crashes",
        "done",
        "ending",
        "error",
        "errored",
        "expired",
        "has_slot",
        "lock",
        "logged",
        "mcp",
        "opening",
        "packed",
        "reads",
        "rested",
        "running",
        "scope",
        "session_id",
        "span",
        "status",
        "tail",
        "users",
        "waiting_slot",
        "woken",
    )

    def __init__(self, state: SessionState, logged: tuple[bool, str | None]) -> None:
        # The state, or while the session rests, the state packed; both while a state
        # unpacked is only read (assigning `state` drops the packed one).
        self._state: SessionState | None = state
        self.packed: PackedState | None = None
        # The packed state's last answer (see `answer`), so that a status read unpacks
        # nothing.
        self._answer: str | None = None
        self.session_id = state.session_id
        # The errored flag and error that the log's last event gives (see `_logged`), or
        # None when the state may differ from what the log rebuilds (an append raised).
        self.logged: tuple[bool, str | None] | None = logged
        # The API calls using this record now (`Host._use`): while any is, it is not dropped.
        self.users = 0
        # The trace context each queued message was sent in, oldest first. The queue itself
        # is `state.queued` (logged); this list, not a deque: an empty deque costs ten
        # times the memory.
        self.contexts: list[tuple[str, object | None]] = []
        self.mcp: McpTools | None = None
        self.span: AgentSpan | None = None
        self.opening: tuple[str, object | None] | None = None
        # Calls whose `local.tool_call` is logged (or that are refused), with the
        # arguments their handler gets (None for a refused call).
        self.announced: dict[str, ToolUse | None] = {}
        # The refusal cache (`refusal`): the pending calls it is for, and each one's refusal.
        self.checked: tuple[tuple[ToolUse, ...], dict[str, str | None]] | None = None
        # The actor takes it uncontended on every commit, with no checkpoint (the append
        # that follows has its own).
        self.lock = SessionLock()
        # Set when there may be new work; the actor looks again before it ends.
        self.woken = False
        # Created by the first waiter and set (then dropped) by the next change, so a
        # change nobody waits for costs no Event: `changed` on any change (long-polls),
        # `rested` on one that leaves the session at rest (`result`).
        self.changed: anyio.Event | None = None
        self.rested: anyio.Event | None = None
        # Long-polls' reads of the log in flight, by `after`: one read serves every poll
        # woken by the same change. None until the first long-poll reads.
        self.reads: dict[int, _SharedRead] | None = None
        # The last events this host logged for the session, kept while someone follows it
        # (see `Host._read_after`): a follower woken by a commit takes them from here
        # instead of reading them back. None while nobody waited at a commit.
        self.tail: tuple[Envelope, ...] | None = None
        # Created by the first to wait for the session's task to end (`task_ended`), set
        # (then dropped) as it ends.
        self.done: anyio.Event | None = None
        # The session task's scope. Shielded, so that only the host cancels the task
        # (`_end_task`), never in the middle of one of its appends.
        self.scope: anyio.CancelScope | None = None
        self.appending = False
        # Waiting for a model-call slot, with no task (`Host._grant_slot` starts one), and
        # granted one its task has not used yet.
        self.waiting_slot = False
        self.has_slot = False
        self.ending = False
        # The outcome of a model call the step timeout cut short, for the task to log in a
        # new scope (`Host._call`).
        self.expired: Called | None = None
        self.backing_off = False
        self.running = False
        self.errored, self.error = logged
        self.crashes: list[float] = []
        self.cancelling: str | None = None
        self.status: HostStatus | None = None

    @property
    def state(self) -> SessionState:
        """The session's state (unpacked on the first read after a rest)."""
        state = self._state
        if state is None:
            assert self.packed is not None, "a record holds its state or its packed state"
            state = self._state = unpack_state(self.packed)
        return state

    @state.setter
    def state(self, state: SessionState) -> None:
        self._state = state
        self.packed = None

    @property
    def bare(self) -> SessionState:
        """The state, to read any field but its history, `seen` and `texts`: while packed,
        the packed state's `rest` (those three emptied), so that nothing is unpacked."""
        state = self._state
        if state is not None:
            return state
        assert self.packed is not None, "a record holds its state or its packed state"
        return self.packed.rest

    @property
    def answer(self) -> str | None:
        """The text of the last assistant message in the state's history (None if none),
        read without unpacking the state."""
        state = self._state
        return last_answer(state.history) if state is not None else self._answer

    def rest(self) -> None:
        """Pack the state of a session at rest (unless it does not pack exactly), and drop
        the refusal cache (checked again on next use). A state only read since the last
        rest is packed already: it is let go."""
        self.checked = None
        if self._state is not None and self.packed is None:
            self.packed = pack_state(self._state)
            self._answer = last_answer(self._state.history)
        if self.packed is not None:
            self._state = None

    async def task_ended(self) -> None:
        """Return once the session has no task (at once if it has none)."""
        if not self.running:
            return
        if self.done is None:
            self.done = anyio.Event()
        await self.done.wait()

    def ended(self) -> None:
        """The session's task has ended: wake whoever waits for that."""
        self.running = False
        done = self.done
        if done is not None:
            self.done = None
            done.set()

    def context_of(self, text: str) -> object | None:
        """The trace context the oldest queued `text` was sent in (None after a restart)."""
        for index, (queued, context) in enumerate(self.contexts):
            if queued == text:
                del self.contexts[index]
                return context
        return None

    def refusal(self, state: SessionState, use: ToolUse) -> str | None:
        """Why `use`, pending in `state`, must not run (it is a bad call, or its approval was
        denied), or None; each call is checked once."""
        if state.approvals:
            denied = denial(state, use)
            if denied is not None:
                return denied
        checked = self.checked
        if checked is not None and checked[0] is state.pending:
            refusals = checked[1]
        else:
            refusals = {}
            self.checked = (state.pending, refusals)
        if use.id not in refusals:
            mcp = self.mcp
            refusals[use.id] = check_call(state.spec, use) if mcp is None else mcp.refusal(use)
        return refusals[use.id]


class _IdleTask:
    """A session task with no session, waiting to be handed one: `session` is set, then
    `handed`, or `handed` alone to end the task."""

    __slots__ = ("handed", "session")

    def __init__(self) -> None:
        self.handed = anyio.Event()
        self.session: _Session | None = None


def _take_up(session: _Session, rebuilt: _Session) -> bool:
    """Make `rebuilt` (read from the log) the session's state; True if the log holds more
    than the session saw. Its errored flag and error are the log's only then (a chat
    error logged, though its append raised): a retry() of an errored session is not
    logged, and a crash of the retried call must not undo it."""
    moved = rebuilt.state.seq != session.state.seq
    if moved:
        session.errored = rebuilt.errored
        session.error = rebuilt.error
    session.state = rebuilt.state
    session.logged = rebuilt.logged
    return moved


class _SharedRead:
    """A read of a session's events after a seq, begun while `changed` was the session's
    change event: every poll that saw the same event may take its outcome instead of
    reading again (a poll that saw a later one must read for itself: a change came
    after this read began)."""

    def __init__(self, changed: anyio.Event) -> None:
        self.changed = changed
        self.done = anyio.Event()
        self.found: list[Envelope] | None = None


_NOT_ERRORED: tuple[bool, str | None] = (False, None)


def _logged(last: Envelope) -> tuple[bool, str | None]:
    """The errored flag and error of a session rebuilt from a log whose last event is `last`
    (one tuple shared by every session whose last event is no failure)."""
    event = last.event
    if not isinstance(event, ChatFailed | Failed):
        return _NOT_ERRORED
    return (last.type == "local.chat_error", event.error)


def _session_of(state: SessionState, last: Envelope) -> _Session:
    """The host's record of a session rebuilt from its log, `last` its last event."""
    return _Session(state, _logged(last))
