"""The Host's sessions at rest: kept in memory up to `max_resting`, the least recently used
dropped beyond it.
"""

from __future__ import annotations

import anyio
import anyio.abc

from turnkeeper.sessions._host_base import HostBase
from turnkeeper.sessions._host_records import HostStatus, _Session


class HostResting(HostBase):
    """Memory kept bounded: at most `max_resting` sessions at rest are held, the least
    recently used beyond it dropped, to be read back from the log on their next use."""

    def _unused(self, session: _Session) -> None:
        """Make a session that no API call uses the most recently used of those at rest, if
        it is at rest with no task, its state packed, and drop the least recently used
        beyond `max_resting`.
        A session passed over (see `_droppable`) leaves them until it is at rest and unused
        again (its task ends, its last use ends): O(1) amortised, each one checked once."""
        if self._stopping or session.running or session.status == "running":
            return
        session_id = session.session_id
        if self._sessions.get(session_id) is not session:
            # Not the host's record: one read back while `start` logged the session, which
            # `start` then replaced with its own. Not the host's to drop.
            return
        session.rest()
        limit = self.max_resting
        if limit is None:
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
        if session.session_id in self._loading:
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
