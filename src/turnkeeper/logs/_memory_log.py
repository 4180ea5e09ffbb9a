"""An event log held in memory: for tests, and the index behind the JSON Lines log."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from operator import attrgetter

import anyio

from turnkeeper.core import gc_paused
from turnkeeper.events import Envelope
from turnkeeper.logs._log import Batch, EventLog, SeqConflict

_session_of = attrgetter("session_id")


class EventStore:
    """Every session's events in memory, with global positions 1, 2, 3... in the order added.

    The caller keeps each session's seqs contiguous; a session's seq n is its n-th event.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, list[Envelope]] = {}
        self._order: list[Envelope] = []

    def add(self, events: Sequence[Envelope]) -> None:
        """Add events, each the next seq of its session."""
        self._order += events
        sessions = self._sessions
        for session_id, run in groupby(events, _session_of):
            sessions.setdefault(session_id, []).extend(run)

    def last_seq(self, session_id: str) -> int:
        """The session's last seq; 0 if it has none."""
        return len(self._sessions.get(session_id, ()))

    def read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        """The session's events with seq > `after`, at most `limit` of them."""
        events = self._sessions.get(session_id, [])
        return events[after:] if limit is None else events[after : after + limit]

    def sessions(self) -> list[str]:
        """Session ids in the order their first event was added."""
        return list(self._sessions)

    def read_all(self, after: int, limit: int | None) -> list[tuple[int, Envelope]]:
        """Events at positions > `after`, with their positions."""
        chosen = self._order[after:] if limit is None else self._order[after : after + limit]
        with gc_paused():
            return list(enumerate(chosen, start=after + 1))


class MemoryLog(EventLog):
    """An event log that lives and dies with the process. Positions are append order."""

    def __init__(self) -> None:
        super().__init__()
        self._store = EventStore()

    def __repr__(self) -> str:
        return "MemoryLog()"

    async def _open(self) -> None:
        pass

    async def _close(self) -> None:
        pass

    async def _append(self, batch: Batch) -> None:
        # Yield like a storage-backed append would, so concurrent appenders interleave.
        await anyio.lowlevel.checkpoint()
        actual = self._store.last_seq(batch.session_id)
        if actual != batch.expected_seq:
            raise SeqConflict(batch.session_id, batch.expected_seq, actual)
        self._store.add(batch.events)

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        return self._store.read(session_id, after, limit)

    async def _last_seq(self, session_id: str) -> int:
        return self._store.last_seq(session_id)

    async def _sessions(self) -> list[str]:
        return self._store.sessions()

    async def _read_all(self, after: int, limit: int | None) -> list[tuple[int, Envelope]]:
        return self._store.read_all(after, limit)
