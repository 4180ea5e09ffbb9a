"""The Host's session actor: the task that advances one session, and its supervision."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import anyio
import anyio.abc
import msgspec

from turnkeeper.core import ToolResult, ToolUse, TurnkeeperError
from turnkeeper.events import (
    AnyEvent,
    Envelope,
    Failed,
    Halted,
    McpFailed,
    OutputAccepted,
    ToolCalled,
    ToolMayHaveRun,
    ToolReturned,
)
from turnkeeper.providers import DeltaSink, step_timeout_error
from turnkeeper.sessions._driver import Called, answer, call_model, compacted, plan_compaction
from turnkeeper.sessions._host_base import HostBase, _log
from turnkeeper.sessions._host_records import _IdleTask, _Session, _take_up
from turnkeeper.sessions._inputs import Input, Resume, UserMessage
from turnkeeper.sessions._poll import begin_poll, build_request, emit
from turnkeeper.sessions._run import RUNNER
from turnkeeper.sessions._step_timeout import WATCHED_CALL
from turnkeeper.sessions._typed import decoded
from turnkeeper.state import SessionState, approval_request, awaiting_approval
from turnkeeper.tools import coerce_call, handled_as_error
from turnkeeper.tracing import AgentSpan


class _HostCalls:
    """What the host does around each call it runs (`ToolCalls`): its `local.tool_call` is
    logged before (`Host._announce`), its result after, with the step's others
    (`Host._advance_tools`); MCP server failures are kept to be logged when the calls
    are done. Refused and failed calls count as tool errors."""

    def __init__(self, host: HostBase, session: _Session) -> None:
        self.host = host
        self.session = session
        self.failures: list[McpFailed] = []

    def refusal(self, use: ToolUse) -> str | None:
        return self.session.refusal(self.session.bare, use)

    async def starting(self, use: ToolUse) -> ToolUse:
        coerced = self.session.announced.get(use.id)
        return coerced if coerced is not None else coerce_call(self.session.bare.spec, use)

    async def failed(self, failure: McpFailed) -> None:
        self.failures.append(failure)

    async def finished(self, use: ToolUse, result: ToolResult, *, ran: bool) -> None:
        if result.is_error:
            self.host._count("tool_errors")


PACK_IN_TOOLS = 1.0
"""Seconds between the looks of a Host at the sessions in their tool calls: a session
in its calls since the look before is packed, as if at rest (after one to two periods).
A tool call that long costs far more than the unpack that follows it."""

_IDLE_TASKS = 64
"""The most session tasks kept waiting idle, or twice the model-call slots if more. A task
waiting idle holds about 13 KB (trio), so 64 are under 1 MB a host. Under a slot limit,
as many tasks run as sessions hold slots, and about as many again finish the turns whose
calls gave their slots back: in bench/host.py (10,000 sessions, 150 slots) a new task
costs the event loop as much as a third of a turn, and tasks started per turn go from
1.33 with no task kept to 0.31 with 64 and 0.001 with 300."""


class HostActor(HostBase):
    """The session actor: a task per session with work to do, which advances it (its
    polls, model calls and tools) until it needs something from outside, supervised
    one-for-one: restarted from the log when it crashes, given up after too many."""

    def _spawn(self, session: _Session) -> None:
        if session.running or session.waiting_slot or self._group is None or not self._accepting:
            return
        if session.state.status in ("cancelled", "failed"):
            return
        session.running = True
        if self._idle:
            idle = self._idle.pop()
            idle.session = session
            idle.handed.set()
        else:
            self._group.start_soon(self._serve, session, name="session task")

    async def _serve(self, session: _Session) -> None:
        """Run `session`, then each session handed to this task while it waits idle: a
        session goes to a task at every turn that waited for a model-call slot, and a
        hand-over costs the event loop a third of a new task. The task ends when the host
        stops taking work, or when enough others wait already (see `_IDLE_TASKS`).

        The sessions the task runs share its scope (shielded: only the host cancels it,
        through `_end_task` or the step timeout), one scope for as long as none of them is
        cancelled: a scope costs the event loop as much as a fifth of a turn. A cancelled
        scope is left, and a new one opened for the next session (or for the same one,
        to log the outcome of its model call that the step timeout cut short)."""
        while True:
            with anyio.CancelScope(shield=True) as scope:
                while True:
                    await self._run(session, scope)
                    if scope.cancel_called:
                        break
                    handed = await self._handed()
                    if handed is None:
                        return
                    session = handed
            if session.expired is None:
                handed = await self._handed()
                if handed is None:
                    return
                session = handed

    async def _handed(self) -> _Session | None:
        """Wait idle for the next session to run, and return it; None at once if the host
        takes no more work or enough tasks wait already, or when the host stops."""
        slots = self.max_model_calls or 0
        if not self._accepting or len(self._idle) >= max(_IDLE_TASKS, 2 * slots):
            return None
        idle = _IdleTask()
        self._idle.append(idle)
        try:
            await idle.handed.wait()
        except BaseException:
            if idle.session is None:
                if idle in self._idle:
                    self._idle.remove(idle)
            elif self._group is not None:
                # Handed one as it was cancelled (asyncio delivers that after the set):
                # the session still needs its task.
                self._group.start_soon(self._serve, idle.session, name="session task")
            raise
        return idle.session

    def _end_idle_tasks(self) -> None:
        """End the tasks waiting idle (the host takes no more work)."""
        idle, self._idle = self._idle, []
        for task in idle:
            task.handed.set()

    def _grant_slot(self, session: _Session) -> bool:
        """Give a model-call slot to a session waiting for one: its task starts, and makes
        its call. False if it has no task to make it (stopping, cancelled, forgotten)."""
        session.waiting_slot = False
        if self._sessions.get(session.session_id) is not session:
            return False
        session.has_slot = True
        self._spawn(session)
        if session.running:
            return True
        session.has_slot = False
        return False

    async def _run(self, session: _Session, scope: anyio.CancelScope) -> None:
        """Supervise the session in its task's `scope`, which cancel() cancels, and stop()
        after the grace (or when the host is cancelled)."""
        session.ending = False
        session.scope = scope
        try:
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
        session_id = session.session_id
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
            if session.has_slot:
                # Granted a slot it did not use (cancelled, or stopping): the next gets it.
                session.has_slot = False
                assert self._model_slots is not None
                self._model_slots.give_back()
            # A model call that outlived the step timeout: the task runs the session on
            # at once, in a new scope, to log the call's outcome (`_serve`); it keeps its
            # task and its span meanwhile.
            runs_on = (
                session.expired is not None and not self._stopping and session.cancelling is None
            )
            if not runs_on:
                session.expired = None
                # Waiting for a slot, the request goes on: its span stays open.
                if not session.waiting_slot:
                    self._close_span(session)
                session.ended()
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
                _log.error("session.unloggable", session_id=session.session_id, error=str(exc))

    async def _act(self, session: _Session) -> None:
        """Advance the session until it needs something from outside, then end: a session
        at rest holds no task (`_wake` starts one when there is work again)."""
        # While the host stops, calls announced already are still run (the stop's grace is
        # for them): else they would be logged as called and never run, and whoever takes
        # the session up would mark them as calls that may have run.
        while session.cancelling is None and (not self._stopping or session.announced):
            # Fields, not the state itself: held through the tool calls, it would keep the
            # history that a session long in its tool calls lets go (`_pack_in_tools`).
            status, in_poll, queued = _next_of(session.bare)
            if status in ("cancelled", "failed"):
                return
            if session.opening is not None:
                self._close_span(session)
                session.span = self._open_span(session, *session.opening)
                session.opening = None
            if not session.errored:
                progressed = True
                if in_poll:
                    pass  # Its model call is made below.
                elif status == "running":
                    await self._poll(session, Resume())
                elif status == "requires_action":
                    with _current(session.span):
                        progressed = await self._advance_tools(session)
                elif queued:
                    text = queued[0]
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
                        with _current(session.span):
                            await self._call_model(session)
                        if session.waiting_slot:
                            # It waits for a slot with no task (`_grant_slot`).
                            return
                    continue
            if not session.woken:
                self._close_span(session)
                return
            session.woken = False

    async def _advance_tools(self, session: _Session) -> bool:
        """Run the calls the host answers itself, and resume once every call has a result.
        False when the remaining calls wait for results from outside."""
        local = await self._calls_to_run(session)
        if local is None:
            return False
        results = await self._run_tools(session, local) if local else []
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
            # Stopping: the results are logged, and the next poll is left to whoever takes
            # the session up.
            if not self._stopping and all(use.id in by_id for use in state.pending):
                # The results and the next poll's input are logged together: one commit.
                resume = Resume(state.pending, tuple(by_id[use.id] for use in state.pending))
                begun, state, _ = begin_poll(state, resume, now=self.clock(), guard=self.guard)
                envelopes.extend(begun)
                self._count_events(begun)
            await self._commit(session, envelopes, state)
        session.announced = {}
        return True

    async def _calls_to_run(self, session: _Session) -> list[ToolUse] | None:
        """The pending calls the host runs itself, each announced (see `_announce`); None
        when none runs and some wait for results from outside, or for approval. Apart from
        `_advance_tools`, so that no frame holds the state while the calls run."""
        state = session.state
        asked = approval_request(state)
        if asked is not None:
            # Calls that want approval and were never asked about: a log that ends between
            # a reply and its `local.approval_requested` (cut short by a crash). Asked now;
            # none runs before every one is decided.
            async with session.lock:
                await self._commit_events(session, [asked])
            return None
        if state.approvals and awaiting_approval(state):
            return None  # No call of the reply runs before every one is decided.
        if state.spec.mcp_servers and session.mcp is None:
            session.mcp = await self._mcp.open(state.spec)
        returned = {result.tool_use_id for result in state.returned}
        local = [
            u for u in state.pending if u.id not in returned and self._runs_here(session, state, u)
        ]
        if not local and not all(use.id in returned for use in state.pending):
            return None
        unannounced = [use for use in local if use.id not in session.announced]
        if unannounced:
            async with session.lock:
                await self._commit_events(
                    session, self._announce(session, session.state, unannounced)
                )
        return local

    def _announce(
        self, session: _Session, state: SessionState, uses: Iterable[ToolUse]
    ) -> list[AnyEvent]:
        """`local.tool_call` events for the calls about to run (logged before they run).

        A call whose `local.tool_call` the log already holds, with no result, was about to
        run when the session's task crashed, its host was killed or its owner lost it: the
        record rebuilt from the log runs it again, `local.tool_may_have_run` first."""
        events: list[AnyEvent] = []
        for use in uses:
            coerced = None
            if session.refusal(state, use) is None:
                coerced = coerce_call(state.spec, use)
                if use.id in state.called:
                    events.append(ToolMayHaveRun(tool_call_id=use.id, name=use.name))
                events.append(ToolCalled(tool_call_id=use.id, name=use.name, input=coerced.input))
            session.announced[use.id] = coerced
        return events

    async def _run_tools(self, session: _Session, uses: Sequence[ToolUse]) -> list[ToolResult]:
        """Run the calls concurrently, at most `tool_concurrency` at a time and started in
        call order (bad calls are answered without running); results in call order. MCP
        server failures are logged as they come back."""
        calls = _HostCalls(self, session)
        in_tools = self._in_tools
        in_tools[session] = self._tick
        if self._tools_added is not None:
            self._tools_added.set()
            self._tools_added = None
        try:
            results = await self._tool_runner.run(
                uses, calls, session_id=session.session_id, spec=session.bare.spec, mcp=session.mcp
            )
        except BaseException:
            # Cut short while they ran (by a cancel that then failed, say): each may have
            # run, and the next task logs that before running it again (`_announce`). A
            # call announced and never begun is not marked.
            session.announced = {}
            raise
        finally:
            del in_tools[session]
        if calls.failures:
            async with session.lock:
                await self._commit_events(session, calls.failures)
        return results

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
        called = session.expired
        if called is not None:
            # The call the step timeout cut short, run on in this scope (see `_call`).
            session.expired = None
        else:
            called = await self._next_call(session)
            if called is None:
                return
        async with session.lock:
            # The state as it is now: messages may have been queued during the call.
            answered = answer(called, session.state, guard=self.guard, clock=self.clock)
            events, ended, failure = answered.events, answered.state, answered.failure
            self._count_events(events)
            if failure is not None:
                self._count("chat_errors")
                await self._commit(session, events, ended)
                session.errored = True
                session.error = failure.message
                self._note(session)
                return
            kind = self._output_type(ended)
            if kind is not None and any(type(e.event) is OutputAccepted for e in events):
                failure_text = decoded(ended, kind)[1]
                if failure_text is not None:
                    halt = Halted(guard=RUNNER, reason="invalid_output", message=failure_text)
                    envelope, ended = emit(ended, halt, at=self.clock())
                    events.append(envelope)
            local = [use for use in ended.pending if self._runs_here(session, ended, use)]
            if ended.approvals and awaiting_approval(ended):
                local = []  # None runs before every call awaiting approval is decided.
            for event in self._announce(session, ended, local):
                envelope, ended = emit(ended, event, at=self.clock())
                events.append(envelope)
            await self._commit(session, events, ended)

    async def _next_call(self, session: _Session) -> Called | None:
        """Make the model call of the poll in flight, in a model-call slot; None if it is
        not made now (it waits for a slot with no task, or the host is stopping)."""
        slots = self._model_slots
        if slots is not None:
            if session.has_slot:
                # Granted while it waited with no task.
                session.has_slot = False
            elif not slots.take():
                # None free: the session waits for one with no task (its task ends here),
                # and `_grant_slot` starts one when a slot is given back to it.
                session.waiting_slot = True
                slots.wait(session)
                return None
            if self._stopping:
                # Its request is logged: the host's next start makes the call.
                slots.give_back()
                return None
        try:
            await self._compact(session)
            self._count("model_calls")
            sink = None
            if self._delta_watchers:
                sink = self._delta_sink(session.session_id, session.state.seq)
            called = await self._call(session, build_request(session.state), sink)
        finally:
            if slots is not None:
                slots.give_back()
        return called

    async def _call(
        self, session: _Session, request: dict[str, Any], sink: DeltaSink | None
    ) -> Called:
        """The model call, bounded by the step timeout. Past it, `_watch_steps` cancels the
        session's task scope: the call's outcome (the timeout's ChatError, or the response
        that came in the same moment) is kept in `session.expired` for the task to log in a
        new scope (`_serve`), as nothing more can run in this one. A scope of its own per
        call would cost the event loop a tenth of a turn."""
        timeout = self.step_timeout
        if timeout is None:
            return await call_model(self.chat, request, sink)
        calls = self._in_calls
        # Every call has the same timeout: the calls' insertion order is their deadlines'.
        calls[session] = anyio.current_time() + timeout
        if self._call_added is not None:
            self._call_added.set()
            self._call_added = None
        reported: list[AnyEvent] = []
        called: Called | None = None
        watched = WATCHED_CALL.set(session)
        try:
            called = await call_model(self.chat, request, sink, reported)
        finally:
            WATCHED_CALL.reset(watched)
            if calls.pop(session, None) is None:
                # The call's outcome: the timeout's ChatError (`watched_chat` turned the
                # cancellation into it) or the reply that came in the same moment; the
                # error made here only if the cancellation met no call to turn.
                session.expired = (
                    called
                    if called is not None
                    else Called(None, step_timeout_error(timeout), reported)
                )
        if session.expired is None:
            return called
        # Expired: the scope's cancellation is raised here (the outcome is logged by the
        # task's next scope); where the scope was not this session's, the outcome is taken.
        await anyio.lowlevel.checkpoint()
        called, session.expired = session.expired, None
        return called

    async def _watch_steps(self, scope: anyio.CancelScope) -> None:
        """Cut short each model call that outlives the step timeout (see `_call`), until
        `scope` is cancelled (by `stop`)."""
        calls = self._in_calls
        with scope:
            while True:
                if not calls:
                    self._call_added = added = anyio.Event()
                    await added.wait()
                    continue
                session, deadline = next(iter(calls.items()))
                now = anyio.current_time()
                if deadline > now:
                    await anyio.sleep(deadline - now)
                    continue
                del calls[session]
                if session.scope is not None:
                    session.scope.cancel()

    async def _pack_in_tools(self, scope: anyio.CancelScope) -> None:
        """Pack the state of each session in its tool calls for `PACK_IN_TOOLS` seconds or
        more (as a session at rest is packed), until `scope` is cancelled (by `stop`).
        Sessions whose calls are quick are never packed: packing a state and unpacking it
        grows with its history, 30 µs after 10 round trips (a tenth of a turn), 100 µs
        after 20."""
        in_tools = self._in_tools
        with scope:
            while True:
                if not in_tools:
                    self._tools_added = added = anyio.Event()
                    await added.wait()
                await anyio.sleep(PACK_IN_TOOLS)
                # In its calls since the tick before this one: for one period or more.
                self._tick += 1
                since = self._tick - 2
                for session, entered in in_tools.items():
                    if entered <= since:
                        session.rest()

    async def _compact(self, session: _Session) -> None:
        """Summarise the session's older turns before its model call, if a compaction is
        due, and log the outcome (in the model-call slot the call holds)."""
        plan = await plan_compaction(self._timed_chat, session.state)
        if plan is None:
            return
        self._count("model_calls")
        called = await call_model(self._timed_chat, plan.request)
        async with session.lock:
            events, state = compacted(called, plan, session.state, clock=self.clock)
            self._count_events(events)
            await self._commit(session, events, state)


def _next_of(state: SessionState) -> tuple[str, bool, tuple[str, ...]]:
    """What the actor's next step depends on: the status, whether a poll is in flight,
    and the queued messages."""
    return state.status, state.in_poll, state.queued


def _describe(exc: BaseException) -> str:
    """`Type: message` of the exception, looking inside a group of one (a task group's)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


_NOT_TRACED = nullcontext()


def _current(span: AgentSpan | None) -> AbstractContextManager[object]:
    """The request's span made current in this task (its model and tool calls' spans are
    its children), or nothing for a session with no span open."""
    return _NOT_TRACED if span is None else span.current()
