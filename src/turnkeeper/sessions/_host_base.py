"""The Host's shared part: its settings and sessions, committing a session's events, and
the status of a session.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectSendStream

from turnkeeper.core import (
    Chat,
    InputError,
    ToolUse,
    TurnkeeperError,
    add_costs,
    check_count,
    check_seconds,
    schema_key,
)
from turnkeeper.events import (
    AnyEvent,
    Compacted,
    CompactionFailed,
    Envelope,
    ModelResponded,
    TokenDelta,
)
from turnkeeper.guards import Guard, default_guards
from turnkeeper.logs import EventLog, MemoryLog
from turnkeeper.providers import DeltaSink
from turnkeeper.sessions._host_records import (
    HostStatus,
    HostStopped,
    SessionInfo,
    _IdleTask,
    _logged,
    _Session,
    _take_up,
)
from turnkeeper.sessions._logging import json_log
from turnkeeper.sessions._poll import emit
from turnkeeper.sessions._slots import Slots
from turnkeeper.sessions._step_timeout import (
    STEP_TIMEOUT,
    check_step_timeout,
    timed_chat,
    watched_chat,
)
from turnkeeper.sessions._tool_runner import ToolRunner
from turnkeeper.sessions._typed import decoded
from turnkeeper.state import SessionState, approval_request, awaiting_approval
from turnkeeper.tools import MAX_TOOL_RESULT_CHARS, McpPool, Tools
from turnkeeper.tracing import AgentSpan, start_agent_span, traced_chat

_std_log = logging.getLogger("turnkeeper.host")
_log = json_log(_std_log)
_CALLS = frozenset(("local.model_response", "local.compacted", "local.compaction_failed"))
"""The events of model calls, whose usage carries a cost."""
# A commit is one to three events: enough for a follower a few commits behind, little to
# hold per followed session.
_TAIL = 8


class HostBase:
    """What every part of the Host shares: its settings, its sessions, and the commit of
    a session's events (logged, then its state, then who waits told), its status and its
    trace spans. The parts: `HostActor`, `HostRecovery`, `HostResting`, and `Host`, the API."""

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
        # The poll's model calls in flight with their deadlines, oldest first, and the
        # watch over them: its event to wake it once it has none, its scope.
        self._in_calls: dict[_Session, float] = {}
        self._call_added: anyio.Event | None = None
        self._step_watch: anyio.CancelScope | None = None
        # The sessions in their tool calls, each with the tick it entered them at, and the
        # watch that packs those in them long (`_pack_in_tools`): its tick, its event to
        # wake it once it has none, its scope.
        self._in_tools: dict[_Session, int] = {}
        self._tick = 0
        self._tools_added: anyio.Event | None = None
        self._tools_watch: anyio.CancelScope | None = None
        # The poll's model calls are bounded by the host's own step watch (`_call`), the
        # summary calls of a compaction, rare, by a wrapper.
        self.chat = traced_chat(
            chat if step_timeout is None else watched_chat(chat, step_timeout, self._in_calls)
        )
        self._timed_chat = traced_chat(timed_chat(chat, step_timeout))
        # A MemoryLog the host makes is never closed: closing it releases nothing, and a
        # closed one would refuse the reads that go on working after a stop.
        self.log = log if log is not None else MemoryLog()
        self._mcp = McpPool()
        self._tool_runner = ToolRunner(
            tools,
            timeout=tool_timeout,
            limit=tool_concurrency,
            max_chars=max_tool_result_chars,
        )
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
        self._model_slots: Slots[_Session] | None = None
        self.clock = clock
        self.counters: dict[str, int] = {}
        # What the model calls this host made have cost, by their sessions' pricing.
        self.cost_total = Decimal(0)
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
        # The types given as output schemas to `start`, by their JSON Schema (`schema_key`):
        # the log holds the schema, and a session's answer is decoded into its type.
        self._output_types: dict[str, Any] = {}
        self._group: anyio.abc.TaskGroup | None = None
        # Session tasks that ran a session to its rest and wait to be handed the next one
        # (`HostActor._spawn`), the longest idle first.
        self._idle: list[_IdleTask] = []
        self._stack: AsyncExitStack | None = None
        self._accepting = False
        self._stopping = False
        # Subscribers to each watched session's deltas (`HostDeltas`), empty most often,
        # and the streams `deltas` gives, which a stop ends.
        self._delta_watchers: dict[str, list[Callable[[TokenDelta], object]]] = {}
        self._delta_streams: set[MemoryObjectSendStream[TokenDelta]] = set()

    if TYPE_CHECKING:
        # The parts' own, which the shared code uses.
        def _delta_sink(self, session_id: str, after: int) -> DeltaSink | None: ...
        def _spawn(self, session: _Session) -> None: ...
        def _end_task(self, session: _Session) -> None: ...
        async def _read(self, session_id: str) -> _Session: ...
        def _unused(self, session: _Session) -> None: ...

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
            if own and session.ending:
                # Its task was cancelled (`_end_task`) before this append began: the cancel
                # is taken here, before anything is written. Taken during the append, it
                # would come once the events are in the log but not in the state we keep.
                await anyio.lowlevel.checkpoint()
            try:
                await self._append(
                    session.session_id,
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
            if session.reads is not None:
                _keep_tail(session, events)
            if session.span is not None:
                session.span.record(events)
        session.state = state
        self._note(session)

    def _tail_trusted(self, session: _Session) -> bool:
        """Whether the session's record is in step with the log, so that its seq is the
        log's last and its tail the log's own events (a shared log's owner says)."""
        return True

    async def _take_up_log(self, session: _Session) -> None:
        """After an append from the API raised: if it was written all the same, take up
        what the log holds (the session's own task does so when it restarts), so that the
        session goes on from there instead of failing every later append's seq check."""
        with anyio.CancelScope(shield=True):
            try:
                rebuilt = await self._read(session.session_id)
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
                    session_id=session.session_id,
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
            self._resting.pop(session.session_id, None)
        elif not session.users:
            self._unused(session)

    def _open_span(self, session: _Session, prompt: str, parent: object | None) -> AgentSpan:
        """Start the trace span of one request; it ends when the session comes to rest. The
        request's turns may run in several tasks (a wait for a model-call slot ends one),
        so it is made current only around the work that opens spans under it."""
        return start_agent_span(session.state, prompt=prompt, parent=parent)

    def _close_span(self, session: _Session) -> None:
        if session.span is not None:
            session.span.finish(session.state)
            session.span.end()
        session.span = None

    def _wake(self, session: _Session) -> None:
        session.woken = True
        self._spawn(session)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _count_events(self, events: Sequence[Envelope]) -> None:
        """Count the guard halts and model call retries among `events`, and add up the
        costs of the model responses, in one pass."""
        for envelope in events:
            kind = envelope.type
            if kind == "local.halted":
                self._count("guard_halts")
            elif kind == "local.chat_retry":
                self._count("chat_retries")
            elif kind in _CALLS:
                event = envelope.event
                if isinstance(event, ModelResponded | Compacted | CompactionFailed):
                    self.cost_total = add_costs(self.cost_total, event.usage.cost)

    def _check_accepting(self) -> None:
        if not self._accepting:
            raise HostStopped("the host is not running (use `async with Host(...)`)")

    # -- status ----------------------------------------------------------------------------

    def _runs_here(self, session: _Session, state: SessionState, use: ToolUse) -> bool:
        """Whether the host answers this call itself (by a handler, an MCP server, or as a
        bad call). Asked in that order: a call its handler takes needs no other check,
        and whether it is a bad call is the dearest to tell."""
        if self._tool_runner.handles(use.name):
            return True
        if session.mcp is not None and session.mcp.serves(use.name):
            return True
        return session.refusal(state, use) is not None

    def _outstanding(self, session: _Session) -> list[ToolUse]:
        """Pending calls without a result that the host will not answer itself."""
        state = session.bare
        if (state.approvals and awaiting_approval(state)) or approval_request(state) is not None:
            return []  # None waits for a result before the calls are approved (or asked about).
        returned = {result.tool_use_id for result in state.returned}
        return [
            use
            for use in state.pending
            if use.id not in returned and not self._runs_here(session, state, use)
        ]

    def _status(self, session: _Session) -> HostStatus:
        state = session.bare
        if state.status in ("failed", "cancelled"):
            return state.status
        if session.errored:
            return "errored"
        if state.in_poll or state.status == "running":
            return "running"
        if state.status == "requires_action":
            if state.approvals and awaiting_approval(state):
                return "awaiting_approval"
            return "requires_action" if self._outstanding(session) else "running"
        if state.queued:
            return "running"
        return "halted" if state.status == "halted" else "idle"

    def _output_type(self, state: SessionState) -> Any | None:
        """The type given to `start` as the output schema of a session with `state`'s spec."""
        schema = state.spec.output_schema
        if not self._output_types or not isinstance(schema, dict):
            return None
        return self._output_types.get(schema_key(schema))

    def _info(self, session: _Session) -> SessionInfo:
        # Nothing here reads the history: a session at rest is not unpacked.
        state = session.bare
        status = self._status(session)
        text = session.answer
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
            awaiting=awaiting_approval(state) if status == "awaiting_approval" else (),
            output=self._typed_output(state),
        )

    def _typed_output(self, state: SessionState) -> Any:
        """The session's typed output, in the type given to `start` if one was (None if it
        is not one of that type: its run ended `invalid_output`)."""
        kind = None if state.output is None else self._output_type(state)
        return state.output if kind is None else decoded(state, kind)[0]


def _keep_tail(session: _Session, events: Sequence[Envelope]) -> None:
    """Keep the last `_TAIL` events the session logged, `events` the newest, for the
    followers `Host._read_after` serves from memory."""
    tail = session.tail
    if tail is not None and tail[-1].seq + 1 == events[0].seq:
        session.tail = (*tail, *events)[-_TAIL:]
    else:
        session.tail = tuple(events[-_TAIL:])
