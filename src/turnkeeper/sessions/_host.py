"""Host: many sessions in one process, each an actor supervised one-for-one.

Every change to a session is an append to the event log before it is visible, so a
session task that crashes is rebuilt from the log, and a new process on the same log
resumes whatever was unfinished. Tools run at least once across crashes: a call
whose result was not logged runs again (`ToolContext.tool_call_id` lets a handler
with side effects dedupe).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, Literal, Self

import anyio
import anyio.abc
import msgspec
import structlog

from turnkeeper.core import (
    AgentSpec,
    ChatError,
    GuardConfig,
    InputError,
    LogCorrupt,
    LogError,
    ReplayError,
    SeqError,
    ToolResult,
    ToolUse,
    TurnkeeperError,
    UnloggableEvent,
    Usage,
    check_count,
    check_seconds,
    gc_paused,
    text_of,
)
from turnkeeper.events import (
    AnyEvent,
    Cancelled,
    ChatFailed,
    Envelope,
    Failed,
    McpFailed,
    MessageQueued,
    ToolCalled,
    ToolReturned,
)
from turnkeeper.guards import Guard, default_guards
from turnkeeper.logs import LARGEST_SEQ, EventLog, MemoryLog, SeqConflict, check_batch
from turnkeeper.providers import collecting_events
from turnkeeper.sessions._inputs import Input, Kickoff, Resume, UserMessage
from turnkeeper.sessions._open import open_session
from turnkeeper.sessions._poll import (
    Chat,
    begin_poll,
    build_request,
    check_results,
    emit,
    end_poll,
    failure_events,
    opened_event,
)
from turnkeeper.sessions._rebuild import rebuilt_on, runs_by_page
from turnkeeper.sessions._slots import Slots
from turnkeeper.sessions._step_timeout import STEP_TIMEOUT, check_step_timeout, timed_chat
from turnkeeper.state import SessionState, replay
from turnkeeper.tools import (
    MAX_TOOL_RESULT_CHARS,
    McpPool,
    McpTools,
    ToolContext,
    Tools,
    as_handler,
    check_call,
    coerce_call,
    handled_as_error,
    run_each,
    run_tool,
)
from turnkeeper.tracing import AgentSpan, agent_span, capture_context, tool_span, traced_chat

HostStatus = Literal[
    "running",
    "requires_action",
    "idle",
    "errored",
    "halted",
    "failed",
    "cancelled",
    "unreadable",
]
"""running: working (or about to). requires_action: waits for tool results from outside.
idle: the turn ended, waits for a message. errored: the model stayed unreachable after
retries (`retry` or a new message resumes it). halted: a guard stopped it. failed: it
crashed too often. cancelled: cancelled from outside. unreadable: its events in the log
cannot be rebuilt into a session (no events, a gap, a damaged row); the host leaves it
alone (quarantined) and `error` says why."""

_std_log = logging.getLogger("turnkeeper.host")
_log = structlog.wrap_logger(
    _std_log,
    wrapper_class=structlog.stdlib.BoundLogger,
    processors=[
        # First: a line below the logger's level costs no timestamp and no JSON.
        structlog.stdlib.filter_by_level,
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.processors.JSONRenderer(),
    ],
    # Else every call binds a new logger (about 3 µs).
    cache_logger_on_first_use=True,
)


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
    from outside; `text` is the model's last answer or why the session stopped."""

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


class _Session:
    """The host's record of one session; the mailbox outlives the session's task."""

    def __init__(self, state: SessionState, logged: tuple[bool, str | None]) -> None:
        self.state = state
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
        self.span_exit: AbstractContextManager[AgentSpan] | None = None
        self.opening: tuple[str, object | None] | None = None
        # Calls whose `local.tool_call` is logged (or that are refused), with the
        # arguments their handler gets (None for a refused call).
        self.announced: dict[str, ToolUse | None] = {}
        self.checked: tuple[tuple[ToolUse, ...], dict[str, str | None]] = ((), {})
        # The actor takes it uncontended on every commit; fast_acquire skips a checkpoint
        # there (the append that follows has its own).
        self.lock = anyio.Lock(fast_acquire=True)
        # Set when there may be new work; the actor looks again before it ends.
        self.woken = False
        # Created by the first waiter and set (then dropped) by the next change, so a
        # change nobody waits for costs no Event: `changed` on any change (long-polls),
        # `rested` on one that leaves the session at rest (`result`).
        self.changed: anyio.Event | None = None
        self.rested: anyio.Event | None = None
        # Long-polls' reads of the log in flight, by `after`: one read serves every poll
        # woken by the same change.
        self.reads: dict[int, _SharedRead] = {}
        self.done = anyio.Event()
        # The session task's scope. Shielded, so that only the host cancels the task
        # (`_end_task`), never in the middle of one of its appends.
        self.scope: anyio.CancelScope | None = None
        self.appending = False
        self.ending = False
        self.backing_off = False
        self.running = False
        self.errored, self.error = logged
        self.crashes: list[float] = []
        self.cancelling: str | None = None
        self.status: HostStatus | None = None

    def context_of(self, text: str) -> object | None:
        """The trace context the oldest queued `text` was sent in (None after a restart)."""
        for index, (queued, context) in enumerate(self.contexts):
            if queued == text:
                del self.contexts[index]
                return context
        return None

    def refusal(self, state: SessionState, use: ToolUse) -> str | None:
        """Why `use`, pending in `state`, must not run, or None; each call is checked once."""
        pending, refusals = self.checked
        if pending is not state.pending:
            refusals = {}
            self.checked = (state.pending, refusals)
        if use.id not in refusals:
            mcp = self.mcp
            refusals[use.id] = check_call(state.spec, use) if mcp is None else mcp.refusal(use)
        return refusals[use.id]


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


def _logged(last: Envelope) -> tuple[bool, str | None]:
    """The errored flag and error of a session rebuilt from a log whose last event is `last`."""
    event = last.event
    return (
        last.type == "local.chat_error",
        event.error if isinstance(event, ChatFailed | Failed) else None,
    )


def _session_of(state: SessionState, last: Envelope) -> _Session:
    """The host's record of a session rebuilt from its log, `last` its last event."""
    return _Session(state, _logged(last))


class Host:
    """Runs many sessions in one process: `async with Host(chat=...) as host`.

    Each session with work to do is a task in the host's task group (one at rest holds
    none until a message or results arrive), restarted from the log when it raises
    (with exponential backoff); more than `max_restarts` crashes within `restart_window`
    seconds mark it failed, and its siblings never notice. On entry the host resumes
    every unfinished session in its log; on exit it stops gracefully: no new work,
    `stop_grace` seconds for sessions to reach a turn boundary, then cancel.
    Tools named in `tools` run in-process; calls of other tools park the session in
    `requires_action` until `submit_tool_results`.

    `max_model_calls` bounds the model calls in flight across all sessions (admission
    control). One event loop serves every session, so when replies arrive faster than
    it can log them, each reply queues behind the others and the time from a reply to
    its events being durable grows with the number of sessions; with a bound, a session
    waits for a slot before its call instead, and a reply is logged soon after it
    arrives. A session waiting for a slot can be cancelled, and on stop it makes no
    call (its request is logged, so the next start of the host makes it). None: no bound.

    `max_resting` bounds the sessions at rest (not running) that the host keeps in
    memory: beyond it, the least recently used are dropped and read back from the log
    on their next use, which sees them exactly as if they had stayed. Sessions in use
    (running, waited on, in an API call) are never dropped and do not count. None: keep
    every session.

    `step_timeout` bounds each model call (300 s unless set; None: no bound): a call that
    takes longer fails as a transient chat error, logged, and leaves the session
    `errored` (`retry` or a new message makes the call again). A result an in-process
    handler returns longer than `max_tool_result_chars` is cut, with a note the model
    reads saying how much was left out.

    A session in the log that cannot be rebuilt (no events, a gap in its seqs, a damaged
    row) is quarantined: logged once as `session.unreadable`, shown by `status` as
    "unreadable" with why in `error`, refused by every other call (SessionUnreadable),
    and counted apart by `statuses`; the other sessions recover and run.
    """

    def __init__(
        self,
        *,
        chat: Chat,
        log: EventLog | None = None,
        tools: Tools | None = None,
        guard: Guard = default_guards,
        mailbox_size: int = 64,
        max_restarts: int = 3,
        restart_window: float = 60.0,
        restart_backoff: float = 0.1,
        max_backoff: float = 10.0,
        stop_grace: float = 10.0,
        tool_concurrency: int = 8,
        tool_timeout: float | None = None,
        step_timeout: float | None = STEP_TIMEOUT,
        max_tool_result_chars: int = MAX_TOOL_RESULT_CHARS,
        max_model_calls: int | None = None,
        max_resting: int | None = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # All checked here: a bad value found later would fail the host mid-run or at exit.
        for name, function in (("chat", chat), ("guard", guard), ("clock", clock)):
            if not callable(function):
                raise InputError(f"Host: {name}: expected a function, got {function!r:.80}")
        if log is not None and not isinstance(log, EventLog):
            raise InputError(f"Host: log: expected an EventLog or None, got {type(log).__name__}")
        check_count("Host: mailbox_size", mailbox_size, 1)
        check_count("Host: max_restarts", max_restarts, 0)
        check_count("Host: tool_concurrency", tool_concurrency, 1)
        if max_model_calls is not None:
            check_count("Host: max_model_calls", max_model_calls, 1, optional=True)
        if max_resting is not None:
            check_count("Host: max_resting", max_resting, 0, optional=True)
        check_seconds("Host: restart_window", restart_window, positive=True)
        check_seconds("Host: restart_backoff", restart_backoff)
        check_seconds("Host: max_backoff", max_backoff)
        check_seconds("Host: stop_grace", stop_grace)
        if tool_timeout is not None:
            check_seconds("Host: tool_timeout", tool_timeout, positive=True, optional=True)
        check_step_timeout("Host: step_timeout", step_timeout)
        check_count("Host: max_tool_result_chars", max_tool_result_chars, 1)
        self.step_timeout = step_timeout
        self.max_tool_result_chars = max_tool_result_chars
        self.chat = traced_chat(timed_chat(chat, step_timeout))
        # A MemoryLog the host makes is never closed: closing it releases nothing, and a
        # closed one would refuse the reads that go on working after a stop.
        self.log = log if log is not None else MemoryLog()
        self._mcp = McpPool()
        # The tools run here by name; None when one handler takes every call (or none).
        # Found once: an ABC's isinstance check is slow, and it was made for every call.
        self._tool_names = tools if isinstance(tools, Mapping) else None
        self._handler = as_handler(tools) if tools is not None else None
        self.guard = guard
        self.mailbox_size = mailbox_size
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.restart_backoff = restart_backoff
        self.max_backoff = max_backoff
        self.stop_grace = stop_grace
        self.tool_concurrency = tool_concurrency
        self.tool_timeout = tool_timeout
        self.max_model_calls = max_model_calls
        self._model_slots: Slots | None = None
        self.clock = clock
        self.counters: dict[str, int] = {}
        # Every append's time, the recent ones apart (the last 5,000 to 10,000).
        self.appends = 0
        self.append_seconds_total = 0.0
        self.append_seconds: list[float] = []
        self._sessions: dict[str, _Session] = {}
        self.max_resting = max_resting
        # The held sessions at rest with no task and no API call using them, least recently
        # used first: the ones `_unused` may drop (see `_droppable`).
        self._resting: OrderedDict[str, _Session] = OrderedDict()
        # Of each dropped session: the status it rested in (`statuses` counts them without
        # reading them back), and its crash times within `restart_window`, if any (its
        # restart intensity is not reset by a drop).
        self._dropped: dict[str, HostStatus] = {}
        self._dropped_crashes: dict[str, list[float]] = {}
        # Reads of sessions the host does not hold, in flight, by id (see `_read_back`).
        self._loading: dict[str, int] = {}
        # The log's sessions that cannot be rebuilt, with why: quarantined, logged once.
        self._unreadable: dict[str, str] = {}
        # Sessions being started, set once `start` has made its record or failed: a call
        # that read one back from the log meanwhile would make a second record, and a
        # second task running the session beside the first.
        self._starting: dict[str, anyio.Event] = {}
        self._group: anyio.abc.TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._accepting = False
        self._stopping = False

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            # Its sessions, slots and flags are the last run's: a Host runs once.
            raise RuntimeError("this Host has run already; make a new Host to run again")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await stack.enter_async_context(self._mcp)
            if self.max_model_calls is not None:
                self._model_slots = Slots(self.max_model_calls)
            self._group = await stack.enter_async_context(anyio.create_task_group())
            self._stack = stack
            self._accepting = True
            await self._recover()
        except BaseException:
            await stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._stack is not None
        try:
            await self.stop()
        except BaseException as exc:
            # Cancelled while stopping: the task group must still be left, and be given the
            # cancellation (it swallows its own, and ends the sessions on any).
            if not await self._stack.__aexit__(type(exc), exc, exc.__traceback__):
                raise
            return True
        return await self._stack.__aexit__(*exc_info)

    # -- the API -------------------------------------------------------------------------

    async def start(
        self,
        spec: AgentSpec,
        prompt: str | None,
        *,
        session_id: str | None = None,
        max_turns: int = 50,
        guards: GuardConfig | None = None,
        history: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """Open a session and start on `prompt`; returns its id once both are logged."""
        self._check_accepting()
        if not isinstance(spec, AgentSpec):
            raise InputError(f"spec: expected an AgentSpec, got {type(spec).__name__}")
        if prompt is not None and not isinstance(prompt, str):
            raise InputError(f"prompt: expected a string or None, got {type(prompt).__name__}")
        events, state = self._opening(spec, prompt, (), session_id, history, max_turns, guards)
        # The sessions this host knows; any other one already in the log (written by
        # another process, or unreadable at recovery) fails the append's seq check.
        if (
            state.session_id in self._sessions
            or state.session_id in self._starting
            or state.session_id in self._unreadable
        ):
            raise _taken(state.session_id)
        started = self._starting[state.session_id] = anyio.Event()
        try:
            mcp = None
            if spec.mcp_servers:
                # Checked as the log will check them before any server starts: a start refused
                # starts none. Then made again with the tools the servers give.
                check_batch(events, 0)
                mcp = await self._mcp.open(spec)
                events, state = self._opening(
                    mcp.spec, prompt, mcp.events, state.session_id, history, max_turns, guards
                )
            try:
                await self._append(state.session_id, events, expected_seq=0)
            except SeqConflict:
                raise _taken(state.session_id) from None
            session = _Session(state, _logged(events[-1]))
            session.mcp = mcp
            if prompt is not None:
                session.opening = (prompt, capture_context())
            self._sessions[state.session_id] = session
            # Given its task first: at rest with none (no prompt), `_note` could drop it.
            self._spawn(session)
            self._note(session)
            return state.session_id
        finally:
            del self._starting[state.session_id]
            started.set()

    def _opening(
        self,
        spec: AgentSpec,
        prompt: str | None,
        failures: Iterable[AnyEvent],
        session_id: str | None,
        history: Sequence[dict[str, Any]] | None,
        max_turns: int,
        guards: GuardConfig | None,
    ) -> tuple[list[Envelope], SessionState]:
        """The events that open a session (with `failures`, its MCP servers' that did not
        start) and start it on `prompt`, and the state they lead to."""
        state = open_session(
            spec, session_id=session_id, history=history, max_turns=max_turns, guards=guards
        )
        opened, state = emit(state, opened_event(state), at=self.clock())
        events = [opened]
        for failure in failures:
            envelope, state = emit(state, failure, at=self.clock())
            events.append(envelope)
        if prompt is not None:
            begun, state, _ = begin_poll(state, Kickoff(prompt), now=self.clock(), guard=self.guard)
            events.extend(begun)
        return events, state

    async def send(self, session_id: str, text: str) -> None:
        """Queue a user message; it starts a new request episode when the session is free."""
        self._check_accepting()
        _check_text("text", text)
        async with self._use(session_id) as session:
            # Logged before the sender hears back, so an accepted message survives a crash:
            # as the next request when the session is at rest, else queued behind its work.
            # Its status is looked at under the lock: a cancel may have been logged meanwhile.
            async with session.lock:
                status = self._status(session)
                if status in ("failed", "cancelled"):
                    raise InputError(f"session {session_id} is {status} and takes no messages")
                if status == "requires_action":
                    ids = ", ".join(use.id for use in self._outstanding(session))
                    raise InputError(
                        f"session {session_id} is waiting for the results of tool calls {ids}; "
                        "submit them first"
                    )
                state = session.state
                if (
                    not session.running
                    and not state.in_poll
                    and not state.queued
                    and state.status in ("idle", "halted")
                ):
                    await self._begin_poll(session, UserMessage(text), own=False)
                    session.opening = (text, capture_context())
                elif len(state.queued) >= self.mailbox_size:
                    raise Busy(
                        f"session {session_id}: mailbox full ({self.mailbox_size} messages queued)"
                    )
                else:
                    await self._commit_events(session, [MessageQueued(text=text)], own=False)
                    session.contexts.append((text, capture_context()))
                    del session.contexts[: -self.mailbox_size]
            session.errored = False
            self._note(session)
            self._wake(session)

    async def submit_tool_results(self, session_id: str, results: Sequence[ToolResult]) -> None:
        """Answer the calls the session waits on; returns once the results are logged."""
        self._check_accepting()
        async with self._use(session_id) as session:
            async with session.lock:
                outstanding = [use.id for use in self._outstanding(session)]
                if not outstanding:
                    raise InputError(f"session {session_id} is not waiting for tool results")
                checked = check_results(session_id, outstanding, results)
                events = [
                    ToolReturned(tool_call_id=r.tool_use_id, text=r.text, is_error=r.is_error)
                    for r in checked.values()
                ]
                await self._commit_events(session, events, own=False)
            self._wake(session)

    async def retry(self, session_id: str) -> None:
        """Try the model call of an errored session again (of any other, do nothing)."""
        self._check_accepting()
        async with self._use(session_id) as session:
            if session.state.status in ("failed", "cancelled"):
                raise InputError(
                    f"session {session_id} is {session.state.status}; nothing to retry"
                )
            if not session.errored:
                # No failed call to make again. Woken, the session would hold a task that
                # finds nothing to do, and a message sent meanwhile would queue behind it.
                return
            session.errored = False
            self._note(session)
            self._wake(session)

    async def cancel(self, session_id: str, reason: str = "cancelled by request") -> None:
        """Stop the session's work now and mark it cancelled (logged once, however many
        cancels race)."""
        self._check_accepting()
        # Checked before the task is ended: a reason the log refuses would cut short the
        # work in flight (to be done again) and cancel nothing.
        _check_text("reason", reason)
        async with self._use(session_id) as session:
            try:
                while session.state.status not in ("cancelled", "failed"):
                    session.cancelling = reason
                    if session.running:
                        if session.scope is not None:
                            self._end_task(session)
                        await session.done.wait()
                    async with session.lock:
                        # A task started meanwhile (a cancel that failed let it go on): end it.
                        if not session.running and session.state.status not in (
                            "cancelled",
                            "failed",
                        ):
                            await self._commit_events(
                                session, [Cancelled(reason=reason)], own=False
                            )
            except BaseException:
                # The cancel is not logged (the log refused it, or this call was cancelled):
                # the session goes on as its log says, not stopped for good with nothing to
                # say why.
                with anyio.CancelScope(shield=True):
                    async with session.lock:
                        if session.state.status not in ("cancelled", "failed"):
                            session.cancelling = None
                            self._wake(session)
                raise

    async def status(self, session_id: str) -> SessionInfo:
        """The session as it is now (status "unreadable" for one its log cannot rebuild)."""
        try:
            async with self._use(session_id) as session:
                return self._info(session)
        except SessionUnreadable as exc:
            return _unreadable_info(session_id, exc.reason)

    async def result(self, session_id: str, *, wait: float | None = None) -> SessionInfo:
        """The session once it is at rest (not running), or as it is after `wait` seconds.
        Raises HostStopped if the host stopped with the session mid-turn: it comes to rest
        only in a host started later on the same log."""
        if wait is not None:
            check_seconds("wait", wait, optional=True)
        async with self._use(session_id) as session:
            with anyio.move_on_after(wait):
                while self._status(session) == "running":
                    if self._stopping and not session.running:
                        raise HostStopped(
                            f"the host stopped before session {session_id} came to rest; a "
                            "host started on the same log goes on with it"
                        )
                    if session.rested is None:
                        session.rested = anyio.Event()
                    await session.rested.wait()
            return self._info(session)

    async def events(self, session_id: str, *, after: int = 0, wait: float = 0.0) -> list[Envelope]:
        """The session's events after seq `after`; if there are none yet, wait up to
        `wait` seconds for one (long-poll)."""
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= LARGEST_SEQ:
            raise InputError(f"after: expected an integer from 0 to 2**63 - 1, got {after!r}")
        check_seconds("wait", wait)
        async with self._use(session_id) as session:
            deadline = anyio.current_time() + wait
            while True:
                if session.changed is None:
                    session.changed = anyio.Event()
                changed = session.changed
                found = await self._read_after(session, after, changed)
                remaining = deadline - anyio.current_time()
                # A stopped host logs nothing more: no point waiting.
                if found or remaining <= 0 or self._stopping:
                    return found
                with anyio.move_on_after(remaining):
                    await changed.wait()

    async def _read_after(
        self, session: _Session, after: int, changed: anyio.Event
    ) -> list[Envelope]:
        """The session's events after seq `after`: from a read another poll began since
        `changed` became the change event, if there is one, else from a read of its own.
        (A thousand polls woken by one change made a thousand reads.)"""
        shared = session.reads.get(after)
        if shared is not None and shared.changed is changed:
            await shared.done.wait()
            if shared.found is not None:
                return list(shared.found)
            # It failed, or the poll that began it gave up: read for ourselves.
        shared = session.reads[after] = _SharedRead(changed)
        try:
            shared.found = await self.log.read(session.state.session_id, after=after)
        finally:
            if session.reads.get(after) is shared:
                del session.reads[after]
            shared.done.set()
        return list(shared.found)

    async def sessions(self) -> list[str]:
        """Every session id in the log, oldest first."""
        return await self.log.sessions()

    async def statuses(self) -> dict[str, int]:
        """How many of the log's sessions have each status, as `status` gives it (those
        that cannot be rebuilt as "unreadable"). A session dropped from memory counts
        with the status it rested in, without being read back."""
        counts: dict[str, int] = {}
        for session_id in await self.log.sessions():
            held = self._sessions.get(session_id)
            status = self._status(held) if held is not None else self._dropped.get(session_id)
            if status is None and session_id in self._unreadable:
                status = "unreadable"
            if status is None:
                # Never read by this host (logged by another since it started).
                try:
                    async with self._use(session_id) as session:
                        status = self._status(session)
                except SessionUnreadable:
                    status = "unreadable"
                except UnknownSession:
                    continue
            counts[status] = counts.get(status, 0) + 1
        return counts

    async def stop(self, grace: float | None = None) -> None:
        """Stop gracefully: take no new work, give sessions `grace` seconds to reach a
        turn boundary, then cancel what is left. The log stays consistent throughout."""
        if grace is not None:
            check_seconds("grace", grace, optional=True)
        self._accepting = False
        self._stopping = True
        limit = self.stop_grace if grace is None else grace
        for session in self._sessions.values():
            # Long-polls return now, with whatever the log holds.
            if session.changed is not None:
                session.changed.set()
                session.changed = None
        for session in self._sessions.values():
            if session.backing_off:
                self._end_task(session)
        try:
            with anyio.move_on_after(limit):
                for session in list(self._sessions.values()):
                    if session.running:
                        await session.done.wait()
        finally:
            # Each session's own scope, not the task group's: the `async with` body runs
            # inside the group's scope and must survive an explicit stop(). Also the way
            # out when the host is cancelled from outside: the sessions are shielded.
            for session in self._sessions.values():
                if session.scope is not None:
                    self._end_task(session)

    # -- loading and recovery ---------------------------------------------------------------

    async def _recover(self) -> None:
        """Rebuild every session in the log and give a task to each with work to do, in
        one pause of the cycle collector: the sessions are a bulk load (see `gc_paused`).

        One pass over the log (`_rebuild_all`), which holds no more sessions at rest than
        `max_resting`; then a read of each session it did not hold as its last event left
        it: one let go before a later event of it, and, if a page of the log does not
        read, every session the pass had not finished (session by session, so that only
        the sessions a damaged row belongs to are lost)."""
        session_ids = await self.log.sessions()
        if not self.log.writable:
            raise LogError(
                f"Host: {self.log!r} only reads (opened read_only, or another log writes "
                "it): a host must write its log"
            )
        with gc_paused():
            try:
                unread, broken = await self._rebuild_all()
            except LogError as exc:
                _log.warning("recovery.read_failed", error=str(exc))
                self._sessions.clear()
                self._resting.clear()
                self._dropped.clear()
                unread, broken = set(session_ids), {}
            for session_id, error in broken.items():
                self._quarantine(session_id, str(error))
            for session_id in session_ids:
                if session_id not in unread and (
                    session_id in self._sessions or session_id in self._dropped
                ):
                    continue
                if session_id in broken:
                    continue
                try:
                    self._sessions[session_id] = await self._read(session_id)
                except (LogError, UnknownSession) as exc:
                    self._quarantine(session_id, _why_unreadable(exc))
            # One transition line for each session held. Those the pass left at rest first,
            # in their order (least recently logged first), which noting each keeps.
            let_go = dict(self._dropped)
            others = [s for i, s in self._sessions.items() if i not in self._resting]
            for session in [*self._resting.values(), *others]:
                self._note(session)
                if self._status(session) == "running":
                    self._spawn(session)
            # And one for each the pass let go (its seq not kept), so that every session
            # recovered has its line, however the pages fell.
            if _std_log.isEnabledFor(logging.INFO):
                for session_id, status in let_go.items():
                    _log.info(
                        "session.transition", session_id=session_id, status=status, previous=None
                    )
        self.counters["sessions_recovered"] = sum(s.running for s in self._sessions.values())

    async def _rebuild_all(self) -> tuple[set[str], dict[str, LogError]]:
        """Hold every session the log holds, rebuilt in one pass over it, page by page: a
        session's events in each page folded on from the state the pages before left it
        in. Those at rest beyond `max_resting` are let go as the pass goes (dropped, least
        recently logged first), so that recovery holds no more of them than the host does
        later. Returns the sessions to read again (let go before a later event of theirs),
        and those whose events do not replay (a gap in their seqs, say), with why.
        LogError if a page cannot be read."""
        unread: set[str] = set()
        broken: dict[str, LogError] = {}
        async for runs in runs_by_page(self.log):
            for session_id, events in runs.items():
                if session_id in unread or session_id in broken:
                    continue
                if self._dropped.pop(session_id, None) is not None:
                    unread.add(session_id)
                    continue
                held = self._sessions.get(session_id)
                found = rebuilt_on(None if held is None else held.state, events)
                if isinstance(found, LogError):
                    broken[session_id] = found
                    self._sessions.pop(session_id, None)
                    self._resting.pop(session_id, None)
                    continue
                if held is None:
                    session = self._sessions[session_id] = _session_of(*found)
                else:
                    # Nothing else has touched the record: it takes the log's word as a new
                    # one would, without the cost of making one.
                    session = held
                    state, last = found
                    session.state = state
                    session.logged = _logged(last)
                    session.errored, session.error = session.logged
                if self._status(session) == "running":
                    self._resting.pop(session_id, None)
                else:
                    self._unused(session)
        return unread, broken

    def _quarantine(self, session_id: str, reason: str) -> None:
        """Leave a session whose events cannot be rebuilt alone for the host's life,
        saying why once: it shows as "unreadable", and every other session goes on."""
        if session_id not in self._unreadable:
            self._unreadable[session_id] = reason
            _log.error("session.unreadable", session_id=session_id, error=reason)

    async def _read(self, session_id: str) -> _Session:
        events = await self.log.read(session_id)
        if not events:
            raise UnknownSession(f"no session {session_id}")
        return _session_of(replay(events), events[-1])

    @asynccontextmanager
    async def _use(self, session_id: str) -> AsyncIterator[_Session]:
        """The session, for an API call: while the call uses it, the host does not drop it
        (a call left holding a dropped record would change a copy nobody reads again)."""
        session = await self._load(session_id)
        try:
            yield session
        finally:
            session.users -= 1
            if not session.users:
                self._unused(session)

    async def _load(self, session_id: str) -> _Session:
        """The session, read back from the log if the host does not hold it, with a use
        taken (`_use` gives it back)."""
        # Checked first: an unhashable id cannot even be looked up.
        if not isinstance(session_id, str) or not session_id:
            raise UnknownSession(f"no session {session_id!r}")
        session = self._sessions.get(session_id)
        if session is None and session_id in self._unreadable:
            raise SessionUnreadable(session_id, self._unreadable[session_id])
        starting = self._starting.get(session_id)
        if session is None and starting is not None:
            await starting.wait()
            session = self._sessions.get(session_id)
        if session is None:
            try:
                session = await self._read_back(session_id)
            except (ReplayError, SeqError, LogCorrupt) as exc:
                # Its events are damaged, not the log unreadable: this session alone fails.
                self._quarantine(session_id, str(exc))
                raise SessionUnreadable(session_id, str(exc)) from None
        else:
            session.users += 1
        # A session with work and no task (recovered, or read from the log) gets one; so
        # does one whose MCP servers are not open yet, which may answer its pending calls.
        state = session.state
        if self._status(session) == "running" or (
            state.status == "requires_action" and state.spec.mcp_servers and session.mcp is None
        ):
            self._spawn(session)
        return session

    async def _read_back(self, session_id: str) -> _Session:
        """The session read from the log and held, with a use taken; or, if another call
        read it back meanwhile, that call's record. While the read is in flight, no record
        of the session is dropped: one that changed after the read began would leave a
        stale read as the only record."""
        self._loading[session_id] = self._loading.get(session_id, 0) + 1
        read: _Session | None = None
        try:
            read = await self._read(session_id)
        finally:
            left = self._loading.pop(session_id) - 1
            if left:
                self._loading[session_id] = left
            held = self._sessions.get(session_id)
            if read is None and held is not None and not held.users:
                # Read back by another call meanwhile, and maybe passed over for dropping
                # because of this read.
                self._unused(held)
        starting = self._starting.get(session_id)
        if starting is not None:
            # Started meanwhile, and its events read before `start` made its record.
            await starting.wait()
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = read
            # As it was when dropped: no transition to log, and the same restart intensity.
            session.status = self._dropped.pop(session_id, None)
            session.crashes = self._dropped_crashes.pop(session_id, [])
        session.users += 1
        self._note(session)
        return session

    # -- the session actor ----------------------------------------------------------------

    def _spawn(self, session: _Session) -> None:
        if session.running or self._group is None or not self._accepting:
            return
        if session.state.status in ("cancelled", "failed"):
            return
        session.running = True
        session.done = anyio.Event()
        self._group.start_soon(self._run, session, name=f"session {session.state.session_id}")

    async def _run(self, session: _Session) -> None:
        """Supervise the session in a scope of its own, which cancel() cancels, and stop()
        after the grace (or when the host is cancelled)."""
        session.ending = False
        try:
            with anyio.CancelScope(shield=True) as session.scope:
                await self._supervise(session)
        finally:
            session.scope = None
            # Ended by a cancel that then failed, which woke it to go on: a task again.
            if session.woken and session.cancelling is None:
                self._spawn(session)

    def _end_task(self, session: _Session) -> None:
        """Cancel the session's task, or, in the middle of one of its appends, as soon as
        the append returns."""
        session.ending = True
        if session.scope is not None and not session.appending:
            session.scope.cancel()

    async def _supervise(self, session: _Session) -> None:
        """Run the session's actor; restart it from the log when it crashes."""
        session_id = session.state.session_id
        try:
            while True:
                try:
                    await self._act(session)
                except BaseException as exc:
                    # A stray cancellation (see `handled_as_error`) is a crash of this
                    # session: left to go on, it would end the host's task group.
                    if not handled_as_error(exc):
                        raise
                    # Ending anyway, so not a crash (`is not None`: a reason may be "").
                    if self._stopping or session.cancelling is not None:
                        return
                    now = anyio.current_time()
                    session.crashes = [
                        t for t in session.crashes if now - t < self.restart_window
                    ] + [now]
                    session.error = _describe(exc)
                    self._count("session_crashes")
                    _log.error("session.crashed", session_id=session_id, error=session.error)
                    if len(session.crashes) > self.max_restarts:
                        await self._give_up(session)
                        return
                    # Doublings capped: past 2**60 the float product overflows (max_restarts
                    # may allow thousands of crashes), and any backoff is capped long before.
                    doublings = min(len(session.crashes) - 1, 60)
                    delay = min(self.max_backoff, self.restart_backoff * 2**doublings)
                    # `stop` ends a session waiting here at once: it is at a turn boundary.
                    session.backing_off = True
                    try:
                        await anyio.sleep(delay)
                    finally:
                        session.backing_off = False
                    try:
                        rebuilt = await self._read(session_id)
                    except (TurnkeeperError, OSError) as exc:
                        session.error = f"cannot rebuild from the log: {exc}"
                        await self._give_up(session)
                        return
                    _take_up(session, rebuilt)
                    # Calls that were about to run when it crashed are logged again first.
                    session.announced = {}
                    _log.info(
                        "session.restarted", session_id=session_id, restarts=len(session.crashes)
                    )
                    # The log may hold more than the crashed task saw (an append that
                    # landed but raised), so the status may have moved: tell the waiters.
                    self._note(session)
                else:
                    return
        finally:
            self._close_span(session)
            session.running = False
            session.done.set()
            self._note(session)

    async def _give_up(self, session: _Session) -> None:
        with anyio.CancelScope(shield=True):
            try:
                async with session.lock:
                    await self._commit_events(session, [Failed(error=session.error or "crashed")])
            except (TurnkeeperError, OSError) as exc:
                # The log refuses the event: the session is failed in memory only (and so is
                # never dropped: `_commit` left `logged` None).
                session.state = msgspec.structs.replace(
                    session.state, status="failed", in_poll=False, stop_reason="failed"
                )
                _log.error(
                    "session.unloggable", session_id=session.state.session_id, error=str(exc)
                )

    async def _act(self, session: _Session) -> None:
        """Advance the session until it needs something from outside, then end: a session
        at rest holds no task (`_wake` starts one when there is work again)."""
        while not self._stopping and session.cancelling is None:
            state = session.state
            if state.status in ("cancelled", "failed"):
                return
            if session.opening is not None:
                self._close_span(session)
                session.span = self._open_span(session, *session.opening)
                session.opening = None
            if not session.errored:
                progressed = True
                if state.in_poll:
                    pass  # Its model call is made below.
                elif state.status == "running":
                    await self._poll(session, Resume())
                elif state.status == "requires_action":
                    progressed = await self._advance_tools(session)
                elif state.queued:
                    text = state.queued[0]
                    self._close_span(session)
                    session.span = self._open_span(session, text, session.context_of(text))
                    await self._poll(session, UserMessage(text))
                else:
                    progressed = False
                if progressed:
                    # Called from here, not from the steps above, so that their locals are
                    # not kept through the model call. It is made even while stopping: it
                    # finishes the turn.
                    if session.state.in_poll:
                        await self._call_model(session)
                    continue
            if not session.woken:
                self._close_span(session)
                return
            session.woken = False

    async def _advance_tools(self, session: _Session) -> bool:
        """Run the calls the host answers itself, and resume once every call has a result.
        False when the remaining calls wait for results from outside."""
        state = session.state
        if state.spec.mcp_servers and session.mcp is None:
            session.mcp = await self._mcp.open(state.spec)
        returned = {result.tool_use_id for result in state.returned}
        local = [
            u for u in state.pending if u.id not in returned and self._runs_here(session, state, u)
        ]
        if not local and not all(use.id in returned for use in state.pending):
            return False
        results: list[ToolResult] = []
        if local:
            unannounced = [use for use in local if use.id not in session.announced]
            if unannounced:
                async with session.lock:
                    await self._commit_events(
                        session, self._announce(session, session.state, unannounced)
                    )
            results = await self._run_tools(session, local)
        async with session.lock:
            state = session.state
            envelopes: list[Envelope] = []
            for result in results:
                event = ToolReturned(
                    tool_call_id=result.tool_use_id, text=result.text, is_error=result.is_error
                )
                envelope, state = emit(state, event, at=self.clock())
                envelopes.append(envelope)
            by_id = {result.tool_use_id: result for result in state.returned}
            if all(use.id in by_id for use in state.pending):
                # The results and the next poll's input are logged together: one commit.
                resume = Resume(state.pending, tuple(by_id[use.id] for use in state.pending))
                begun, state, _ = begin_poll(state, resume, now=self.clock(), guard=self.guard)
                envelopes.extend(begun)
                self._count_events(begun)
            await self._commit(session, envelopes, state)
        session.announced = {}
        return True

    def _runs_here(self, session: _Session, state: SessionState, use: ToolUse) -> bool:
        """Whether the host answers this call itself (by a handler, an MCP server, or as a
        bad call)."""
        if session.refusal(state, use) is not None:
            return True
        if session.mcp is not None and session.mcp.serves(use.name):
            return True
        if self._handler is None:
            return False
        return self._tool_names is None or use.name in self._tool_names

    def _announce(
        self, session: _Session, state: SessionState, uses: Iterable[ToolUse]
    ) -> list[AnyEvent]:
        """`local.tool_call` events for the calls about to run (logged before they run)."""
        events: list[AnyEvent] = []
        for use in uses:
            coerced = None
            if session.refusal(state, use) is None:
                coerced = coerce_call(state.spec, use)
                events.append(ToolCalled(tool_call_id=use.id, name=use.name, input=coerced.input))
            session.announced[use.id] = coerced
        return events

    async def _run_tools(self, session: _Session, uses: Sequence[ToolUse]) -> list[ToolResult]:
        """Run the calls concurrently, at most `tool_concurrency` at a time and started in
        call order (bad calls are answered without running); results in call order. MCP
        server failures are logged as they come back."""
        results: dict[str, ToolResult] = {}
        failures: list[McpFailed] = []

        async def one(use: ToolUse) -> None:
            refusal = session.refusal(session.state, use)
            if refusal is not None:
                results[use.id] = ToolResult(use.id, refusal, is_error=True)
                self._count("tool_errors")
                return
            coerced = session.announced.get(use.id)
            use = coerced if coerced is not None else coerce_call(session.state.spec, use)
            ctx = ToolContext(session.state.session_id, use.id, use.name)
            mcp = session.mcp
            failure: McpFailed | None = None
            with tool_span(use, session.state.spec.tool(use.name)) as span:
                if mcp is not None and mcp.serves(use.name):
                    result, failure = await mcp.call(use, ctx, timeout=self.tool_timeout)
                else:
                    assert self._handler is not None
                    result = await run_tool(
                        self._handler,
                        use,
                        ctx,
                        timeout=self.tool_timeout,
                        max_chars=self.max_tool_result_chars,
                    )
                span.result(result, failure)
            results[use.id] = result
            if failure is not None:
                failures.append(failure)
            if result.is_error:
                self._count("tool_errors")

        await run_each(one, uses, limit=self.tool_concurrency)
        if failures:
            async with session.lock:
                await self._commit_events(session, failures)
        return [results[use.id] for use in uses]

    async def _poll(self, session: _Session, given: Input) -> None:
        """Log the poll's input and guard events (the caller makes its model call). A
        queued message leaves the queue in the same commit (its `local.user_message`)."""
        async with session.lock:
            await self._begin_poll(session, given)

    async def _begin_poll(self, session: _Session, given: Input, *, own: bool = True) -> None:
        """Log `given` and the guard events before its model call (caller holds the lock)."""
        events, state, _ = begin_poll(session.state, given, now=self.clock(), guard=self.guard)
        self._count_events(events)
        await self._commit(session, events, state, own=own)

    async def _call_model(self, session: _Session) -> None:
        """Make the model call of the poll in flight and log its answer (or its failure)."""
        slots = self._model_slots
        if slots is not None:
            await slots.take()
            if self._stopping:
                # Its request is logged: the host's next start makes the call.
                slots.give_back()
                return
        self._count("model_calls")
        response: object = None
        failure: ChatError | None = None
        with collecting_events() as reported:
            try:
                response = await self.chat(build_request(session.state))
            except ChatError as error:
                failure = error
            finally:
                if slots is not None:
                    slots.give_back()
        async with session.lock:
            # The state as it is now: messages may have been queued during the call.
            state = session.state
            if failure is None:
                try:
                    events, ended = end_poll(
                        state, response, now=self.clock(), guard=self.guard, reported=reported
                    )
                except ChatError as error:
                    failure = error
            if failure is not None:
                self._count("chat_errors")
                failed = failure_events(
                    state, failure, reported, at=self.clock(), response=response
                )
                await self._commit(session, list(failed), _advance_seq(state, len(failed)))
                session.errored = True
                session.error = failure.message
                self._note(session)
                return
            self._count_events(events)
            local = [use for use in ended.pending if self._runs_here(session, ended, use)]
            for event in self._announce(session, ended, local):
                envelope, ended = emit(ended, event, at=self.clock())
                events.append(envelope)
            await self._commit(session, events, ended)

    # -- logging and notification -----------------------------------------------------------

    async def _commit_events(
        self, session: _Session, events: Sequence[AnyEvent], *, own: bool = True
    ) -> None:
        """Log `events` as the session's next seqs and apply them (caller holds the lock)."""
        state = session.state
        envelopes: list[Envelope] = []
        for event in events:
            envelope, state = emit(state, event, at=self.clock())
            envelopes.append(envelope)
        await self._commit(session, envelopes, state, own=own)

    async def _commit(
        self,
        session: _Session,
        events: Sequence[Envelope],
        state: SessionState,
        *,
        own: bool = True,
    ) -> None:
        """Make `events` durable, then make `state` (which they lead to) the session's.
        `own`: called in the session's task (else in a caller's, the API's)."""
        if events:
            try:
                await self._append(
                    session.state.session_id,
                    events,
                    expected_seq=session.state.seq,
                    task_of=session if own else None,
                )
            except BaseException:
                # Written or not, we cannot tell: in step with the log again once it is read
                # (`_take_up`) or a later append passes the seq check.
                session.logged = None
                if not own:
                    await self._take_up_log(session)
                raise
            session.logged = _logged(events[-1])
            if session.span is not None:
                session.span.record(events)
        session.state = state
        self._note(session)

    async def _take_up_log(self, session: _Session) -> None:
        """After an append from the API raised: if it was written all the same, take up
        what the log holds (the session's own task does so when it restarts), so that the
        session goes on from there instead of failing every later append's seq check."""
        with anyio.CancelScope(shield=True):
            try:
                rebuilt = await self._read(session.state.session_id)
            except (TurnkeeperError, OSError):
                return
        if _take_up(session, rebuilt):
            self._note(session)
            self._wake(session)

    async def _append(
        self,
        session_id: str,
        events: Sequence[Envelope],
        *,
        expected_seq: int,
        task_of: _Session | None = None,
    ) -> None:
        """Log `events`, uncancelled: a cancelled append could leave the log ahead of the
        state we keep. In the task of session `task_of`, which only `_end_task` cancels,
        that waits for the append (cheaper than a shield on every turn); in any other
        task, the append is shielded."""
        started = time.perf_counter()
        if task_of is None:
            with anyio.CancelScope(shield=True):
                await self.log.append(events, expected_seq=expected_seq)
        else:
            task_of.appending = True
            try:
                await self.log.append(events, expected_seq=expected_seq)
            finally:
                task_of.appending = False
                if task_of.ending:
                    self._end_task(task_of)
        taken = time.perf_counter() - started
        self.appends += 1
        self.append_seconds_total += taken
        self.append_seconds.append(taken)
        if len(self.append_seconds) > 10_000:
            del self.append_seconds[:5_000]

    def _note(self, session: _Session) -> None:
        """Wake long-pollers, log the transition if the status changed, and wake the
        waiters for a session at rest if it is."""
        changed = session.changed
        if changed is not None:
            session.changed = None
            changed.set()
        status = self._status(session)
        if status != session.status:
            # Asked first: a line the level drops still costs its processors about 7 µs,
            # and a Host makes two transitions a turn.
            if _std_log.isEnabledFor(logging.INFO):
                _log.info(
                    "session.transition",
                    session_id=session.state.session_id,
                    status=status,
                    previous=session.status,
                    seq=session.state.seq,
                )
            session.status = status
        if session.rested is not None and (
            status != "running" or (self._stopping and not session.running)
        ):
            session.rested.set()
            session.rested = None
        if status == "running":
            self._resting.pop(session.state.session_id, None)
        elif not session.users:
            self._unused(session)

    # -- keeping memory bounded ------------------------------------------------------------

    def _unused(self, session: _Session) -> None:
        """Make a session that no API call uses the most recently used of those at rest, if
        it is at rest with no task, and drop the least recently used beyond `max_resting`.
        A session passed over (see `_droppable`) leaves them until it is at rest and unused
        again (its task ends, its last use ends): O(1) amortised, each one checked once."""
        limit = self.max_resting
        if limit is None or self._stopping or session.running or session.status == "running":
            return
        session_id = session.state.session_id
        if self._sessions.get(session_id) is not session:
            # Not the host's record: one read back while `start` logged the session, which
            # `start` then replaced with its own. Not the host's to drop.
            return
        resting = self._resting
        resting[session_id] = session
        resting.move_to_end(session_id)
        while len(resting) > limit:
            oldest_id, oldest = resting.popitem(last=False)
            status = self._droppable(oldest)
            if status is not None:
                self._drop(oldest_id, oldest, status)

    def _droppable(self, session: _Session) -> HostStatus | None:
        """The session's status if it may be dropped from memory, else None: if nothing
        uses it and reading it back from the log gives the same record, so that no call can
        tell it was dropped.

        In use: a task (which covers its backoff, trace span, appends and the lock while
        the task holds it); an API call (`users`: which covers every waiter, on `changed`,
        `rested`, `done` or a shared read, a cancel in progress and the lock held by the
        API; a `changed` or `rested` left over by a call that ended waits for no one); a
        read of it from the log in flight (`_read_back`).

        What the log does not hold: open MCP connections (the tools and spec they give);
        an errored flag or an error shown that differ from what its last event gives, or a
        state that may differ from the log's (`logged`); and, unless it is cancelled or
        failed (it never runs again), what its next task would start from: the messages
        of a poll about to begin (`opening`), the trace contexts of queued messages, calls
        announced, a cancel, a wake-up. Not kept, as it changes nothing once at rest: an
        error not shown (the next errored or failed status sets its own), the refusal cache
        (`checked`), the last status noted (restored from `_dropped`). Crash times within
        `restart_window` are kept apart (`_drop`)."""
        if session.running or session.users or session.mcp is not None:
            return None
        state = session.state
        if state.session_id in self._loading:
            return None
        status = self._status(session)
        logged = session.logged
        if status == "running" or logged is None:
            return None
        errored, error = logged
        if status in ("errored", "failed") and session.error != error:
            return None
        if status not in ("cancelled", "failed") and (
            session.errored != errored
            or session.opening is not None
            or session.contexts
            or session.announced
            or session.cancelling is not None
            or session.woken
        ):
            return None
        return status

    def _drop(self, session_id: str, session: _Session, status: HostStatus) -> None:
        """Forget the session (`_read_back` reads it again on its next use)."""
        del self._sessions[session_id]
        self._dropped[session_id] = status
        now = anyio.current_time()
        crashes = [t for t in session.crashes if now - t < self.restart_window]
        if crashes:
            self._dropped_crashes[session_id] = crashes

    def _open_span(self, session: _Session, prompt: str, parent: object | None) -> AgentSpan:
        """Start the trace span of one request; it ends when the session comes to rest."""
        span_context = agent_span(session.state, prompt=prompt, parent=parent)
        span = span_context.__enter__()
        session.span_exit = span_context
        return span

    def _close_span(self, session: _Session) -> None:
        if session.span is not None and session.span_exit is not None:
            session.span.finish(session.state)
            session.span_exit.__exit__(None, None, None)
        session.span = None
        session.span_exit = None

    def _wake(self, session: _Session) -> None:
        session.woken = True
        self._spawn(session)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _count_events(self, events: Sequence[Envelope]) -> None:
        """Count the guard halts and model call retries among `events`, in one pass."""
        for envelope in events:
            kind = envelope.type
            if kind == "local.halted":
                self._count("guard_halts")
            elif kind == "local.chat_retry":
                self._count("chat_retries")

    def _check_accepting(self) -> None:
        if not self._accepting:
            raise HostStopped("the host is not running (use `async with Host(...)`)")

    # -- status ----------------------------------------------------------------------------

    def _outstanding(self, session: _Session) -> list[ToolUse]:
        """Pending calls without a result that the host will not answer itself."""
        state = session.state
        returned = {result.tool_use_id for result in state.returned}
        return [
            use
            for use in state.pending
            if use.id not in returned and not self._runs_here(session, state, use)
        ]

    def _status(self, session: _Session) -> HostStatus:
        state = session.state
        if state.status in ("failed", "cancelled"):
            return state.status
        if session.errored:
            return "errored"
        if state.in_poll or state.status == "running":
            return "running"
        if state.status == "requires_action":
            return "requires_action" if self._outstanding(session) else "running"
        if state.queued:
            return "running"
        return "halted" if state.status == "halted" else "idle"

    def _info(self, session: _Session) -> SessionInfo:
        state = session.state
        status = self._status(session)
        text: str | None = None
        for message in reversed(state.history):
            if message.get("role") == "assistant":
                text = text_of(message)
                break
        if state.status == "halted" and state.halt_message is not None:
            text = state.halt_message
        return SessionInfo(
            session_id=state.session_id,
            status=status,
            pending=tuple(self._outstanding(session)) if status == "requires_action" else (),
            stop_reason=state.stop_reason,
            text=text,
            result=state.result,
            usage=state.usage,
            polls=state.polls,
            seq=state.seq,
            queued=len(state.queued),
            error=session.error if status in ("errored", "failed") else None,
        )


def _why_unreadable(exc: LogError | UnknownSession) -> str:
    """Why recovery could not rebuild a session, from what reading it raised."""
    if isinstance(exc, LogError):
        return str(exc)
    # Listed by the log (a sessions row, an order entry) with no events to rebuild it from.
    return "the log lists the session but holds none of its events"


def _unreadable_info(session_id: str, reason: str) -> SessionInfo:
    """A quarantined session as `status` shows it: nothing known but why."""
    return SessionInfo(
        session_id=session_id,
        status="unreadable",
        pending=(),
        stop_reason=None,
        text=None,
        result=None,
        usage=Usage(),
        polls=0,
        seq=0,
        queued=0,
        error=reason,
    )


def _taken(session_id: str) -> InputError:
    return InputError(f"session_id: {session_id} already exists")


def _check_text(name: str, value: object) -> None:
    """Raise InputError unless `value` is a string the log can hold (UnloggableEvent, an
    InputError, for one with a lone surrogate)."""
    if not isinstance(value, str):
        raise InputError(f"{name}: expected a string, got {type(value).__name__}")
    # ASCII always encodes; only other text is worth the copy an encode makes.
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise UnloggableEvent(f"{name}: cannot encode event: {exc}") from None


def _describe(exc: BaseException) -> str:
    """`Type: message` of the exception, looking inside a group of one (a task group's)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _advance_seq(state: SessionState, count: int) -> SessionState:
    """The state after `count` events that change nothing but the seq."""
    return msgspec.structs.replace(state, seq=state.seq + count)


def _halt_message(state: SessionState) -> str | None:
    """Why a halted session stopped, as told to the user (kept as its last halt's message)."""
    return state.halt_message
