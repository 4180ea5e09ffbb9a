"""The Host's forks: a new session whose log begins as the first events of another's."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import anyio

from turnkeeper.core import InputError
from turnkeeper.logs import SeqConflict
from turnkeeper.sessions._fork import fork_events
from turnkeeper.sessions._host_base import HostBase
from turnkeeper.sessions._host_records import SessionInfo, _Session


class HostForks(HostBase):
    """`fork`, the Host's API call that starts a session as a fork of another."""

    if TYPE_CHECKING:
        # HostRecovery's, which the Host has.
        def _use(self, session_id: str) -> AbstractAsyncContextManager[_Session]: ...

    async def fork(self, session_id: str, at_seq: int, new_id: str | None = None) -> SessionInfo:
        """Start a new session (`new_id`, or a new id) whose log begins as the first
        `at_seq` events of session `session_id`'s, then `local.forked`; it then runs on its
        own, from where the origin was at `at_seq`, and the origin is not touched. Returns
        the new session's status once its log is written.

        UnknownSession (SessionUnreadable) if there is no such session (it cannot be
        rebuilt); InputError naming `at_seq` if it is not a seq of the session, cuts a
        step short or finds it cancelled or failed, and naming `new_id` if that is taken."""
        self._check_accepting()
        async with self._use(session_id):
            events = await self.log.read(session_id)
        envelopes, state = fork_events(events, at_seq, new_id, at=self.clock())
        new_id = state.session_id
        if self._known(new_id):
            raise _taken(new_id)
        started = self._starting[new_id] = anyio.Event()
        try:
            await self._append(new_id, envelopes, expected_seq=0)
        except SeqConflict:
            raise _taken(new_id) from None
        finally:
            del self._starting[new_id]
            started.set()
        # Read back as recovery reads a session: given a task if it has work to do.
        async with self._use(new_id) as session:
            return self._info(session)

    def _known(self, session_id: str) -> bool:
        """Whether this host holds, starts or quarantined a session of this id (one only
        in the log fails the append's seq check)."""
        return (
            session_id in self._sessions
            or session_id in self._starting
            or session_id in self._unreadable
            or session_id in self._dropped
        )


def _taken(session_id: str) -> InputError:
    return InputError(f"new_id: session {session_id} already exists")
