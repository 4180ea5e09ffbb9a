"""FleetOwner: the part of a FleetHost that owns sessions on a SharedLog: the takeover
scan and the inbox loop, taking sessions up (claims, catching a record up with the log),
losing them (FenceLost, a failed database), and the lease held before each model call and
tool. `_fleet.py` adds the API on top: requests routed to the owner through the inbox."""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Awaitable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Self, TypeVar

import anyio
import msgspec

from turnkeeper.core import (
    ApprovalDecision,
    InputError,
    LogError,
    ReplayError,
    ToolResult,
    ToolUse,
    TurnkeeperError,
    check_seconds,
)
from turnkeeper.events import Envelope
from turnkeeper.logs import Claim, FenceLost, InboxItem, SeqConflict, SharedLog
from turnkeeper.sessions._host import Host
from turnkeeper.sessions._host_records import (
    Busy,
    HostStopped,
    UnknownSession,
    _logged,
    _Session,
)
from turnkeeper.sessions._logging import json_log
from turnkeeper.state import fold

_log = json_log(logging.getLogger("turnkeeper.fleet"))
_T = TypeVar("_T")

# The takeover scan's mean interval at the default lease (10 s), and its least number
# per lease when the lease is short.
_SCAN_INTERVAL = 1.0
_SCANS_PER_LEASE = 8
# How often a worker whose lease is in doubt looks again.
_LEASE_POLL = 0.05
# Waits longer than this are made of waits this long (a log refuses an infinite one).
_LONGEST_WAIT = 60.0

_REFUSALS: dict[str, type[TurnkeeperError]] = {
    "InputError": InputError,
    "UnloggableEvent": InputError,
    "Busy": Busy,
    "UnknownSession": UnknownSession,
    "HostStopped": HostStopped,
}


class _MessagePayload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    text: str


class _ResultsPayload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    results: tuple[ToolResult, ...]


class _ApprovalsPayload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    decisions: tuple[ApprovalDecision, ...]


class _CancelPayload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    reason: str


class _Consuming:
    """The inbox item an API call made for it consumes with its first append."""

    def __init__(self, item: InboxItem) -> None:
        self.item: InboxItem | None = item


_consuming: ContextVar[_Consuming | None] = ContextVar("turnkeeper_consuming", default=None)


def default_scan_interval(lease: float) -> float:
    """The mean seconds between takeover scans by default: a second, or an eighth of the
    lease when it is shorter than 8 s, so that a dead worker's sessions move within the
    lease and a fraction of it (a 2 s lease: scans every 0.25 s, jittered)."""
    return min(_SCAN_INTERVAL, lease / _SCANS_PER_LEASE)


def session_id_for(request_id: str) -> str:
    """The id of the session a create with this idempotency key makes: the same on every
    worker, so that a create sent again (to any worker) finds the session the first made."""
    return "local_" + hashlib.sha256(request_id.encode()).hexdigest()[:16]


class FleetOwner(Host):
    """A Host that owns sessions on a SharedLog, with a lease (see FleetHost)."""

    def __init__(
        self,
        *,
        log: SharedLog,
        scan_interval: float | None = None,
        outcome_wait: float | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(log, SharedLog):
            raise InputError(
                f"FleetHost: log: expected a SharedLog (PostgresLog), got {type(log).__name__}"
            )
        if scan_interval is None:
            scan_interval = default_scan_interval(log.lease)
        check_seconds("FleetHost: scan_interval", scan_interval, positive=True)
        if outcome_wait is not None:
            check_seconds("FleetHost: outcome_wait", outcome_wait, optional=True)
        super().__init__(log=log, **options)
        self.shared = log
        self.scan_interval = float(scan_interval)
        self.outcome_wait = (
            log.lease + 2 * self.scan_interval + 1.0 if outcome_wait is None else outcome_wait
        )
        # Sessions owned whose record is in step with the log, each with the epoch of the
        # claim it is in step under: a claim lost, or made again, leaves it behind.
        self._fresh: dict[str, int] = {}
        # The API calls waiting on a record in memory, per session: cancelled when the
        # record is forgotten, to go on from the log.
        self._record_waiters: dict[str, set[anyio.CancelScope]] = {}
        # Sessions being taken up: none gets a task until `_adopt` has finished.
        self._adopting: set[str] = set()
        self._adopt_locks: dict[str, anyio.Lock] = {}
        # Sessions owned whose record was forgotten when the database failed under them.
        self._aside: set[str] = set()
        self._loops = anyio.CancelScope()

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        assert self._group is not None
        self._group.start_soon(self._background, name="fleet scans and inbox")
        return self

    # -- the worker's own loops -------------------------------------------------------------

    async def _background(self) -> None:
        with self._loops:
            async with anyio.create_task_group() as group:
                group.start_soon(self._keep_claiming)
                group.start_soon(self._keep_consuming)

    async def _keep_claiming(self) -> None:
        """The takeover scan, about every `scan_interval` seconds (jittered, so that the
        workers' scans spread out)."""
        while True:
            self._forget_lost()
            if self._accepting and self.shared.lease_held:
                try:
                    claims = await self.shared.claim()
                except LogError as exc:
                    _log.warning("fleet.claim_failed", error=str(exc))
                    claims = []
                for claim in claims:
                    await self._adopt(claim)
                await self._take_up_set_aside()
            await anyio.sleep(self.scan_interval * random.uniform(0.5, 1.5))

    async def _keep_consuming(self) -> None:
        """Consume the inbox items of the sessions this worker owns, as they come."""
        while True:
            try:
                await self.shared.wait_for_inbox(self.scan_interval)
                items = await self.shared.inbox() if self.shared.lease_held else []
            except LogError as exc:
                _log.warning("fleet.inbox_failed", error=str(exc))
                # The database out of reach: not again at once.
                await anyio.sleep(self.scan_interval)
                continue
            left = False
            for item in items:
                if not self._accepting:
                    return
                left |= not await self._consume(item)
            if left or (items == [] and not self.shared.lease_held):
                # Items that could not be consumed now: not again at once.
                await anyio.sleep(min(0.2, self.scan_interval))

    # -- taking sessions up and losing them -------------------------------------------------

    def _owned(self, session_id: str) -> bool:
        return self.shared.epoch(session_id) is not None

    def _trusted(self, session_id: str) -> bool:
        """Whether this worker's record of the session is the session as it is: owned,
        in step with the log under the claim held, and the lease known to be live (a
        worker paused past its lease, or cut off, may have lost sessions it still holds
        until its lease is renewed and its claims checked)."""
        epoch = self.shared.epoch(session_id)
        return epoch is not None and self._fresh.get(session_id) == epoch and self.shared.lease_held

    def _tail_trusted(self, session: _Session) -> bool:
        return self._trusted(session.session_id)

    async def _own(self, session_id: str) -> bool:
        """Whether this worker owns the session, claiming it if no live worker does, with
        its record in step with the log; False if another live worker owns it."""
        if self._trusted(session_id):
            return True
        claim = await self.shared.claim_session(session_id)
        if claim is None:
            return False
        if claim.epoch:
            await self._adopt(claim)
        return True

    async def _adopt(self, claim: Claim) -> None:
        """Take up a session claimed: its record caught up with the log, and a task if it
        has work (which marks the calls its last owner may have run before running them
        again, as every record rebuilt from the log does: `Host._announce`)."""
        session_id = claim.session_id
        lock = self._adopt_locks.setdefault(session_id, anyio.Lock())
        async with lock:
            if self._trusted(session_id):
                return
            epoch = self.shared.epoch(session_id)
            if epoch is None:
                # Lost again while waiting for the lock.
                return
            held = self._sessions.get(session_id)
            if held is not None and held.running and self._fresh.get(session_id) != epoch:
                # The task of an earlier claim (the session was lost and claimed again):
                # it ends, and the session is taken up from the log.
                self._forget(session_id)
            if claim.taken_from is not None:
                _log.info(
                    "fleet.takeover",
                    session_id=session_id,
                    epoch=claim.epoch,
                    taken_from=claim.taken_from,
                    seq=claim.last_seq,
                    worker=self.shared.worker_id,
                )
            self._adopting.add(session_id)
            try:
                async with self._use(session_id):
                    self._fresh[session_id] = epoch
            except (UnknownSession, LogError, ReplayError) as exc:
                # No events yet (only inbox items), or none that rebuild: consumed or
                # refused as requests come.
                _log.info("fleet.adopt_skipped", session_id=session_id, error=str(exc))
                return
            finally:
                self._adopting.discard(session_id)
                if not lock.statistics().tasks_waiting:
                    self._adopt_locks.pop(session_id, None)
            held = self._sessions.get(session_id)
            if held is not None and self._status(held) == "running":
                self._spawn(held)

    def _lose(self, session_id: str, lost: FenceLost) -> None:
        """Forget a session another worker took: its next use here reads it from the log."""
        _log.warning(
            "fleet.fence_lost",
            session_id=session_id,
            held=lost.held,
            owner=lost.owner,
            epoch=lost.epoch,
            worker=self.shared.worker_id,
        )
        self._forget(session_id)

    def _forget(self, session_id: str) -> None:
        """Forget the record of a session: its task ends, the calls waiting on it go on
        from the log, and its next use here reads it from the log."""
        self._fresh.pop(session_id, None)
        for scope in self._record_waiters.pop(session_id, ()):
            scope.cancel()
        session = self._sessions.get(session_id)
        if session is not None and session.running:
            # Its task ends by itself (its next write raises FenceLost too): the record
            # goes once it has.
            self._end_task(session)
        self._sessions.pop(session_id, None)
        self._resting.pop(session_id, None)
        self._dropped.pop(session_id, None)
        self._dropped_crashes.pop(session_id, None)

    def _forget_lost(self) -> None:
        """Forget the records kept in step under a claim this worker no longer holds at
        that epoch (its log let go of the claim: see SharedLog.lease_held)."""
        for session_id, epoch in list(self._fresh.items()):
            if self.shared.epoch(session_id) != epoch and session_id not in self._adopting:
                _log.warning(
                    "fleet.claim_lost",
                    session_id=session_id,
                    epoch=epoch,
                    worker=self.shared.worker_id,
                )
                self._forget(session_id)

    async def _in_memory(self, session_id: str, call: Awaitable[_T]) -> _T | None:
        """What `call` (an API call of the Host's, on the record in memory) returns; None
        if the record is forgotten meanwhile."""
        scope = anyio.CancelScope()
        watchers = self._record_waiters.setdefault(session_id, set())
        watchers.add(scope)
        try:
            with scope:
                return await call
            return None
        finally:
            watchers.discard(scope)
            if not watchers and self._record_waiters.get(session_id) is watchers:
                del self._record_waiters[session_id]

    def _set_aside(self, session: _Session, exc: BaseException) -> None:
        """Forget the record of a session still owned, for the scan to take it up again."""
        session_id = session.session_id
        _log.warning("fleet.set_aside", session_id=session_id, error=str(exc))
        self._fresh.pop(session_id, None)
        if self._sessions.get(session_id) is session:
            del self._sessions[session_id]
        self._resting.pop(session_id, None)
        self._aside.add(session_id)

    async def _take_up_set_aside(self) -> None:
        """Take up again the sessions set aside that this worker still owns."""
        for session_id in list(self._aside):
            epoch = self.shared.epoch(session_id)
            if epoch is None:
                self._aside.discard(session_id)
                continue
            await self._adopt(Claim(session_id, epoch, 0))
            if session_id in self._fresh:
                self._aside.discard(session_id)

    async def _catch_up(self, session: _Session) -> None:
        """Fold into a record of a session owned elsewhere what the log holds past it."""
        events = await self.log.read(session.session_id, after=session.state.seq)
        if events:
            session.state = fold(session.state, events)
            session.logged = _logged(events[-1])
            session.errored, session.error = session.logged
            self._note(session)

    # -- the Host's steps, on a shared log --------------------------------------------------

    async def _recover(self) -> None:
        """Nothing read at start: this worker's sessions come to it by claims."""
        if not self.log.writable:
            raise LogError(f"FleetHost: {self.log!r} only reads: a host must write its log")

    def _spawn(self, session: _Session) -> None:
        session_id = session.session_id
        if (
            not self._owned(session_id)
            or session_id in self._adopting
            or self._sessions.get(session_id) is not session
        ):
            # Not this worker's, being taken up, or a record forgotten (lost, or set
            # aside): its task must not run again (the one taken up runs).
            return
        super()._spawn(session)

    async def _load(self, session_id: str) -> _Session:
        if isinstance(session_id, str):
            held = self._sessions.get(session_id)
            if held is not None and not held.running and not self._trusted(session_id):
                try:
                    await self._catch_up(held)
                except (ReplayError, LogError) as exc:
                    raise UnknownSession(f"session {session_id} cannot be rebuilt: {exc}") from None
        return await super()._load(session_id)

    async def _act(self, session: _Session) -> None:
        try:
            await super()._act(session)
        except BaseException as exc:
            lost = _fence_lost(exc)
            if lost is not None:
                session_id = session.session_id
                self._lose(session_id, lost)
                if self._owned(session_id):
                    # Claimed again meanwhile (`_leased`): the next scan takes it up.
                    self._aside.add(session_id)
                return
            if not _database_failed(exc):
                raise
            # The database failed under it (a restart, a dropped connection): its state
            # here may be ahead of the log or behind it. Not a crash of the session:
            # taken up again from the log once the database answers.
            self._set_aside(session, exc)

    async def _call_model(self, session: _Session) -> None:
        await self._leased(session)
        await super()._call_model(session)

    async def _run_tools(self, session: _Session, uses: Sequence[ToolUse]) -> list[ToolResult]:
        await self._leased(session)
        return await super()._run_tools(session, uses)

    async def _leased(self, session: _Session) -> None:
        """Return at once while the lease is held; else once it is again, if the session
        is still this worker's (FenceLost if not: another may have taken it meanwhile)."""
        if _lease_held(self.shared):
            return
        session_id = session.session_id
        held = self.shared.epoch(session_id)
        _log.warning("fleet.lease_in_doubt", session_id=session_id, worker=self.shared.worker_id)
        # The lease is a time on a clock the heartbeat moves: nothing to wait on but it.
        while not _lease_held(self.shared):  # noqa: ASYNC110
            await anyio.sleep(_LEASE_POLL)
        claim = await self.shared.claim_session(session_id)
        if claim is None or claim.epoch != held:
            raise FenceLost(
                session_id, held=held, owner=None, epoch=claim.epoch if claim else (held or 0)
            )

    async def _append(
        self,
        session_id: str,
        events: Sequence[Envelope],
        *,
        expected_seq: int,
        task_of: _Session | None = None,
    ) -> None:
        consuming = _consuming.get()
        item = consuming.item if consuming is not None else None
        if item is None or task_of is not None or item.session_id != session_id:
            await super()._append(session_id, events, expected_seq=expected_seq, task_of=task_of)
            return
        # The API call consuming `item` logs what it did in the same transaction.
        assert consuming is not None
        consuming.item = None
        with anyio.CancelScope(shield=True):
            await self.shared.consume(item, events, expected_seq=expected_seq)

    if TYPE_CHECKING:
        # The API's own (FleetHost), which the inbox loop uses.
        async def _consume(self, item: InboxItem) -> bool: ...


def _lease_held(log: SharedLog) -> bool:
    return log.lease_held


def _database_failed(exc: BaseException) -> bool:
    """Whether `exc` (or the one inside a group of one) is the log failing to reach its
    database, or a seq conflict after a write that raised (the log holds more than the
    session saw): not damage, and not a fault of the session's."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return type(exc) is LogError or isinstance(exc, SeqConflict)


def _fence_lost(exc: BaseException) -> FenceLost | None:
    """The FenceLost `exc` is, or the one inside a group of one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, FenceLost) else None


def _refusal(outcome: str) -> TurnkeeperError:
    """The error an owner refused an inbox item with, as it raised it."""
    name, _, message = outcome.partition(": ")
    kind = _REFUSALS.get(name, InputError)
    return kind(message if name in _REFUSALS else outcome)
