"""Host: many sessions in one process, each an actor supervised one-for-one.

Every change to a session is an append to the event log before it is visible, so a
session task that crashes is rebuilt from the log, and a new process on the same log
resumes whatever was unfinished. Tools run at least once across crashes: a call
whose result was not logged runs again (`ToolContext.tool_call_id` lets a handler
with side effects dedupe).

The Host is made of parts, one module each: the API (here), the session actor
(`_host_actor`), recovery from the log (`_host_recovery`), sessions at rest
(`_host_resting`), decisions on calls awaiting approval (`_host_approvals`), streamed
replies (`_host_deltas`), and what they share (`_host_base`, `_host_records`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AsyncExitStack
from typing import Any, Self

import anyio
import anyio.abc

from turnkeeper.core import (
    AgentSpec,
    GuardConfig,
    InputError,
    ToolResult,
    UnloggableEvent,
    Usage,
    check_seconds,
    output_type,
    schema_key,
    with_output_schema,
)
from turnkeeper.events import AnyEvent, Cancelled, Envelope, MessageQueued, ToolReturned
from turnkeeper.logs import LARGEST_SEQ, SeqConflict, check_batch
from turnkeeper.sessions._host_actor import HostActor
from turnkeeper.sessions._host_approvals import HostApprovals
from turnkeeper.sessions._host_deltas import HostDeltas
from turnkeeper.sessions._host_fork import HostForks
from turnkeeper.sessions._host_records import (
    Busy,
    HostStopped,
    SessionInfo,
    SessionUnreadable,
    UnknownSession,
    _logged,
    _Session,
    _SharedRead,
)
from turnkeeper.sessions._host_recovery import HostRecovery
from turnkeeper.sessions._host_resting import HostResting
from turnkeeper.sessions._inputs import Kickoff, UserMessage
from turnkeeper.sessions._open import open_session
from turnkeeper.sessions._poll import begin_poll, check_results, emit, opened_event
from turnkeeper.sessions._slots import Slots
from turnkeeper.state import SessionState, approval_request, awaiting_approval
from turnkeeper.tracing import capture_context


class Host(HostActor, HostRecovery, HostResting, HostApprovals, HostForks, HostDeltas):
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

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            # Its sessions, slots and flags are the last run's: a Host runs once.
            raise RuntimeError("this Host has run already; make a new Host to run again")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await stack.enter_async_context(self._mcp)
            if self.max_model_calls is not None:
                self._model_slots = Slots(self.max_model_calls, self._grant_slot)
            self._group = await stack.enter_async_context(anyio.create_task_group())
            self._stack = stack
            self._accepting = True
            await self._recover()
            if self.step_timeout is not None:
                # Started once nothing can fail the entry (which leaves the task group and
                # waits for its tasks); its scope made here, so that a stop before the task
                # first runs ends it too. Calls made meanwhile wait in `_in_calls`.
                self._step_watch = anyio.CancelScope()
                self._group.start_soon(self._watch_steps, self._step_watch, name="step watch")
            self._tools_watch = anyio.CancelScope()
            self._group.start_soon(self._pack_in_tools, self._tools_watch, name="tools watch")
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
        """Open a session and start on `prompt`; returns its id once both are logged.

        A spec whose `output_schema` is a type is logged with that type's JSON Schema, and
        the session's answer is decoded into it (`SessionInfo.output`) by this host, for
        every session of that schema: a host started later on the same log decodes them
        once a session of that type is started on it (until then, `output` is JSON)."""
        self._check_accepting()
        if not isinstance(spec, AgentSpec):
            raise InputError(f"spec: expected an AgentSpec, got {type(spec).__name__}")
        kind = output_type(spec.output_schema)
        spec = with_output_schema(spec)
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
            if kind is not None and isinstance(spec.output_schema, dict):
                self._output_types[schema_key(spec.output_schema)] = kind
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
        # A transcript ending in calls that need approval: asked for before they can run.
        asked = approval_request(state)
        if asked is not None:
            envelope, state = emit(state, asked, at=self.clock())
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
                if status == "awaiting_approval":
                    ids = ", ".join(use.id for use in awaiting_approval(session.state))
                    raise InputError(
                        f"session {session_id} is waiting for the approval of tool calls "
                        f"{ids}; approve or deny them first"
                    )
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
            status = session.bare.status
            if status in ("failed", "cancelled"):
                raise InputError(f"session {session_id} is {status}; nothing to retry")
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
                        await session.task_ended()
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
        """The session's events after seq `after`: none if the session has none past it,
        those it logged last if they are all of them (`_keep_tail`), else from a read
        another poll began since `changed` became the change event, if there is one, else
        from a read of its own. (A thousand polls woken by one change made a thousand
        reads; a stream of deltas' followers read each event back twice.)"""
        reads = session.reads
        if reads is None:
            # From now on the session keeps a tail of its events for its followers.
            reads = session.reads = {}
        if session.logged is not None and self._tail_trusted(session):
            seq = session.bare.seq
            if after >= seq:
                return []
            tail = session.tail
            if tail is not None and tail[-1].seq == seq and tail[0].seq <= after + 1:
                return list(tail[after + 1 - tail[0].seq :])
        shared = reads.get(after)
        if shared is not None and shared.changed is changed:
            await shared.done.wait()
            if shared.found is not None:
                return list(shared.found)
            # It failed, or the poll that began it gave up: read for ourselves.
        shared = reads[after] = _SharedRead(changed)
        try:
            shared.found = await self.log.read(session.session_id, after=after)
        finally:
            if reads.get(after) is shared:
                del reads[after]
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
        self._end_idle_tasks()
        limit = self.stop_grace if grace is None else grace
        self._end_deltas()
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
                    await session.task_ended()
        finally:
            # Each session's own scope, not the task group's: the `async with` body runs
            # inside the group's scope and must survive an explicit stop(). Also the way
            # out when the host is cancelled from outside: the sessions are shielded.
            for session in self._sessions.values():
                if session.scope is not None:
                    self._end_task(session)
            if self._step_watch is not None:
                self._step_watch.cancel()
            if self._tools_watch is not None:
                self._tools_watch.cancel()


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
