"""The Host's recovery from its log: every session rebuilt on entry, and one not held read
back on its use.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from turnkeeper.core import LogCorrupt, LogError, ReplayError, SeqError, gc_paused
from turnkeeper.sessions._host_base import HostBase, _log, _std_log
from turnkeeper.sessions._host_records import (
    SessionUnreadable,
    UnknownSession,
    _logged,
    _Session,
    _session_of,
)
from turnkeeper.sessions._rebuild import rebuilt_on, runs_by_page
from turnkeeper.state import replay


class HostRecovery(HostBase):
    """Sessions from the log: every one rebuilt when the host starts, and one the host does
    not hold read back when an API call uses it."""

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
        state = session.bare
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


def _why_unreadable(exc: LogError | UnknownSession) -> str:
    """Why recovery could not rebuild a session, from what reading it raised."""
    if isinstance(exc, LogError):
        return str(exc)
    # Listed by the log (a sessions row, an order entry) with no events to rebuild it from.
    return "the log lists the session but holds none of its events"
