"""FleetHost: a Host that is one worker of many sharing one log (a SharedLog: PostgresLog).

A worker runs only the sessions it owns. It takes them by claims: the takeover scan
(about every second, with jitter) claims the sessions of workers whose lease expired and
sessions released with work to do; a request for a session with no live owner claims it
for the worker that got the request. A request for a session another live worker owns is
posted to the inbox, and that worker consumes it once, in one fenced transaction with the
events it logs. Reads (status, events, long-polls) of a session owned elsewhere are
answered from the log, and a long-poll waits on the log's notifications.

A write of a session the worker no longer owns raises FenceLost and writes nothing; the
session's task here then ends without another write. A worker whose lease is not known to
be live starts no model call and no tool, and answers reads from the log, not from its
records (a worker paused past its lease may have lost sessions it still holds); once its
lease is renewed and its claims checked, it forgets the records of the sessions taken
meanwhile and goes on only with those it still owns.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import msgspec

from turnkeeper.core import (
    AgentSpec,
    ApprovalDecision,
    GuardConfig,
    InputError,
    LogCorrupt,
    LogError,
    ReplayError,
    SeqError,
    ToolResult,
    check_seconds,
)
from turnkeeper.events import Envelope
from turnkeeper.logs import FenceLost, InboxItem
from turnkeeper.sessions._fleet_owner import (
    _LONGEST_WAIT,
    FleetOwner,
    _ApprovalsPayload,
    _CancelPayload,
    _Consuming,
    _consuming,
    _log,
    _MessagePayload,
    _refusal,
    _ResultsPayload,
    session_id_for,
)
from turnkeeper.sessions._host_approvals import check_decisions
from turnkeeper.sessions._host_records import (
    Busy,
    HostStatus,
    HostStopped,
    SessionInfo,
    UnknownSession,
)


class FleetHost(FleetOwner):
    """A Host on a SharedLog, one worker of a fleet: `async with FleetHost(chat=..., log=
    PostgresLog(url)) as host`. It takes every option a Host does, and `scan_interval`
    (the mean seconds between takeover scans; by default a second, or an eighth of the
    log's lease when that is shorter than 8 s) and `outcome_wait` (how long a request
    posted to another worker's inbox waits to hear what came of it; by default the
    lease and two scans, long enough for a takeover if that worker is dead).

    Every call of the API works on any worker for any session (see the module). The ones
    that change a session take `request_id`, the client's idempotency key: with one, the
    request goes through the inbox, where a second with the same key does nothing again.
    Stopping releases every session this worker owns: those with work left for the next
    scan of another worker to take at once, those at rest for whichever worker next gets
    a request for them.
    """

    async def stop(self, grace: float | None = None) -> None:
        self._loops.cancel()
        await super().stop(grace)
        held = self.shared.held()
        if not held:
            return
        active = [
            session_id
            for session_id in held
            if (session := self._sessions.get(session_id)) is not None
            and self._status(session) == "running"
        ]
        resting = [session_id for session_id in held if session_id not in set(active)]
        with anyio.CancelScope(shield=True):
            try:
                if active:
                    await self.shared.release(active, active=True)
                if resting:
                    await self.shared.release(resting, active=False)
            except LogError as exc:
                # Its lease runs out instead, and the scans of other workers take them then.
                _log.warning("fleet.release_failed", error=str(exc))
                return
        self._fresh.clear()
        _log.info(
            "fleet.released", active=len(active), resting=len(resting), worker=self.shared.worker_id
        )

    # -- the API, on any worker -------------------------------------------------------------

    async def start(
        self,
        spec: AgentSpec,
        prompt: str | None,
        *,
        session_id: str | None = None,
        max_turns: int = 50,
        guards: GuardConfig | None = None,
        history: Sequence[dict[str, Any]] | None = None,
        request_id: str | None = None,
    ) -> str:
        """As Host.start; with `request_id` and no `session_id`, the session's id is the
        key's (`session_id_for`), so that a create sent twice makes one session."""
        if request_id is not None and session_id is None:
            session_id = session_id_for(request_id)
        try:
            started = await super().start(
                spec,
                prompt,
                session_id=session_id,
                max_turns=max_turns,
                guards=guards,
                history=history,
            )
        except FenceLost:
            # Another live worker owns a session of that id.
            raise InputError(f"session_id: {session_id} already exists") from None
        epoch = self.shared.epoch(started)
        if epoch is not None:
            self._fresh[started] = epoch
        return started

    async def send(self, session_id: str, text: str, *, request_id: str | None = None) -> None:
        """As Host.send, on any worker (see the class for `request_id`)."""
        self._check_accepting()
        await self._route(
            session_id,
            "message",
            {"text": text},
            request_id,
            lambda: super(FleetHost, self).send(session_id, text),
        )

    async def submit_tool_results(
        self,
        session_id: str,
        results: Sequence[ToolResult],
        *,
        request_id: str | None = None,
    ) -> None:
        """As Host.submit_tool_results, on any worker (see the class for `request_id`)."""
        self._check_accepting()
        payload = {"results": msgspec.to_builtins(list(results))}
        await self._route(
            session_id,
            "tool_results",
            payload,
            request_id,
            lambda: super(FleetHost, self).submit_tool_results(session_id, results),
        )

    async def approve(
        self,
        session_id: str,
        decisions: Sequence[ApprovalDecision],
        *,
        request_id: str | None = None,
    ) -> None:
        """As Host.approve, on any worker (see the class for `request_id`)."""
        self._check_accepting()
        payload = {"decisions": msgspec.to_builtins(check_decisions(decisions))}
        await self._route(
            session_id,
            "approvals",
            payload,
            request_id,
            lambda: super(FleetHost, self).approve(session_id, decisions),
        )

    async def cancel(
        self,
        session_id: str,
        reason: str = "cancelled by request",
        *,
        request_id: str | None = None,
    ) -> None:
        """As Host.cancel, on any worker (see the class for `request_id`)."""
        self._check_accepting()
        await self._route(
            session_id,
            "cancel",
            {"reason": reason},
            request_id,
            lambda: super(FleetHost, self).cancel(session_id, reason),
        )

    async def retry(self, session_id: str, *, request_id: str | None = None) -> None:
        """As Host.retry, on any worker (see the class for `request_id`)."""
        self._check_accepting()
        await self._route(
            session_id, "retry", {}, request_id, lambda: super(FleetHost, self).retry(session_id)
        )

    async def _route(
        self,
        session_id: str,
        kind: str,
        payload: dict[str, Any],
        request_id: str | None,
        here: Callable[[], Awaitable[None]],
    ) -> None:
        """Do a request here if this worker owns the session or can claim it, else post it
        to the owner's inbox and wait for what came of it (a refusal is raised here as the
        owner raised it). With `request_id`, always through the inbox: the owner (this
        worker, if it can be) consumes each key once."""
        if not isinstance(session_id, str) or not session_id:
            raise UnknownSession(f"no session {session_id!r}")
        if request_id is None:
            while await self._own(session_id):
                try:
                    await here()
                except FenceLost as lost:
                    # Taken meanwhile: to its new owner, then.
                    self._lose(session_id, lost)
                    continue
                except LogError:
                    # Logged or not, we cannot tell: the next request reads the log again.
                    self._fresh.pop(session_id, None)
                    raise
                return
        else:
            await self._own(session_id)
        if await self.log.last_seq(session_id) == 0:
            raise UnknownSession(f"no session {session_id}")
        posted = await self.shared.post(session_id, kind, payload, request_id=request_id)
        consumed = await self.shared.outcome(posted.item.id, wait=self.outcome_wait)
        if consumed is not None and consumed.outcome is not None:
            raise _refusal(consumed.outcome)

    async def _consume(self, item: InboxItem) -> bool:
        """Do what the inbox item asks, consuming it in the same transaction as the events
        that record it (or with none, and the refusal, if it changes nothing); False if it
        is left for later (this worker lost the session, or the log failed)."""
        session_id = item.session_id
        try:
            if not await self._own(session_id):
                return False
        except LogError:
            return False
        consuming = _Consuming(item)
        token = _consuming.set(consuming)
        outcome: str | None = None
        try:
            await self._apply(item)
        except FenceLost as lost:
            self._lose(session_id, lost)
            return False
        except (InputError, Busy, UnknownSession, HostStopped) as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        except LogError as exc:
            _log.warning(
                "fleet.consume_failed", item=item.id, session_id=session_id, error=str(exc)
            )
            return consuming.item is None
        finally:
            _consuming.reset(token)
        if consuming.item is None:
            return True
        try:
            await self._consume_quietly(item, outcome)
        except FenceLost as lost:
            self._lose(session_id, lost)
            return False
        except LogError as exc:
            _log.warning(
                "fleet.consume_failed", item=item.id, session_id=session_id, error=str(exc)
            )
            return False
        return True

    async def _apply(self, item: InboxItem) -> None:
        session_id, kind = item.session_id, item.kind
        try:
            if kind == "message":
                text = msgspec.convert(item.payload, _MessagePayload).text
                await super().send(session_id, text)
            elif kind == "tool_results":
                results = msgspec.convert(item.payload, _ResultsPayload).results
                await super().submit_tool_results(session_id, results)
            elif kind == "approvals":
                decisions = msgspec.convert(item.payload, _ApprovalsPayload).decisions
                await super().approve(session_id, decisions)
            elif kind == "cancel":
                reason = msgspec.convert(item.payload, _CancelPayload).reason
                await super().cancel(session_id, reason)
            elif kind == "retry":
                await super().retry(session_id)
            else:
                raise InputError(f"inbox item {item.id}: no request of kind {kind!r}")
        except msgspec.ValidationError as exc:
            raise InputError(f"inbox item {item.id}: {kind} payload: {exc}") from None

    async def _consume_quietly(self, item: InboxItem, outcome: str | None) -> None:
        """Consume the item with no events, at the session's seq as this worker holds it."""
        with anyio.CancelScope(shield=True):
            try:
                async with self._use(item.session_id) as session, session.lock:
                    await self.shared.consume(
                        item, (), expected_seq=session.state.seq, outcome=outcome
                    )
            except UnknownSession:
                await self.shared.consume(item, (), expected_seq=0, outcome=outcome)

    async def status(self, session_id: str) -> SessionInfo:
        """As Host.status; of a session this worker is not sure to have in step (owned
        elsewhere, or maybe lost while its lease was in doubt), from the log."""
        if isinstance(session_id, str):
            held = self._sessions.get(session_id)
            if held is not None and held.running and not self._trusted(session_id):
                # Its task here may be behind the log (it ends at its next write if the
                # session moved); a record read anew says where the session is.
                try:
                    return self._info(await self._read(session_id))
                except (ReplayError, SeqError, LogCorrupt):
                    pass  # Damaged: Host.status quarantines it.
        return await super().status(session_id)

    async def result(self, session_id: str, *, wait: float | None = None) -> SessionInfo:
        """As Host.result; of a session owned elsewhere, waiting on the log."""
        if wait is not None:
            check_seconds("wait", wait, optional=True)
        deadline = anyio.current_time() + (math.inf if wait is None else wait)
        while True:
            if self._trusted(session_id):
                remaining = deadline - anyio.current_time()
                waited = None if math.isinf(remaining) else max(0.0, remaining)
                info = await self._in_memory(session_id, super().result(session_id, wait=waited))
                if info is not None and self._trusted(session_id):
                    return info
                # Forgotten meanwhile, or the lease in doubt: from the log.
                continue
            info = await self.status(session_id)
            remaining = deadline - anyio.current_time()
            if info.status != "running" or remaining <= 0 or self._stopping:
                return info
            await self.shared.wait_for_events(
                session_id, after=info.seq, timeout=min(remaining, _LONGEST_WAIT)
            )

    async def events(self, session_id: str, *, after: int = 0, wait: float = 0.0) -> list[Envelope]:
        """As Host.events; of a session owned elsewhere, a long-poll waits on the log."""
        check_seconds("wait", wait)
        deadline = anyio.current_time() + wait
        while self._trusted(session_id):
            remaining = max(0.0, deadline - anyio.current_time())
            found = await self._in_memory(
                session_id, super().events(session_id, after=after, wait=remaining)
            )
            if found is not None:
                return found
        found = await super().events(session_id, after=after, wait=0.0)
        while not found and not self._stopping:
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                break
            await self.shared.wait_for_events(
                session_id, after=after, timeout=min(remaining, _LONGEST_WAIT)
            )
            found = await self.log.read(session_id, after=after)
        return found

    async def statuses(self) -> dict[str, int]:
        """How many of the sessions this worker owns have each status (another worker's
        are counted by that worker)."""
        counts: dict[str, int] = {}
        for session_id in self.shared.held():
            held = self._sessions.get(session_id)
            status: HostStatus | None = (
                self._status(held) if held is not None else self._dropped.get(session_id)
            )
            if status is not None:
                counts[status] = counts.get(status, 0) + 1
        return counts

    async def inbox_depth(self) -> int:
        """Inbox items not consumed yet for the sessions this worker owns."""
        return len(await self.shared.inbox())
