"""The inspector's index of a log's sessions: each one's summary, kept in the order of
last activity, counted by status, and read on from the log as it grows.

It reads the log itself (`read_all` after the last position it has seen), so it serves
a Host's log and one another process writes alike. Reading is done by requests, within
a time budget (`catch_up`): the first request to a large log gets the sessions read so
far and `indexing` true, and the next ones read on, so no request waits for the whole
log and no task runs for a page nobody looks at.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Awaitable, Callable

import anyio
import msgspec

from turnkeeper.core import LogCorrupt, SeqError, gc_paused
from turnkeeper.events import Envelope
from turnkeeper.logs import EventLog
from turnkeeper.service._logging import log as _log
from turnkeeper.service._summary import ListedStatus, SessionSummary, Tracker
from turnkeeper.sessions import SessionUnreadable, UnknownSession

Reopen = Callable[[], Awaitable[EventLog]]
"""Opens the log anew, for a log whose open instance does not see what another process
appends (a JsonlLog holds what its directory held when it opened)."""

# Events read at a time: a read and its fold take tens of milliseconds, so a request
# keeps to its budget within one of them.
_PAGE = 5_000
# How often a read of a session's events (a tail) looks at the log again, when the log
# is not a Host's, which would wake it.
_TAIL_SECONDS = 0.5
_REOPEN_SECONDS = 1.0
_REOPEN_FACTOR = 5


def _at(envelope: Envelope) -> float:
    return envelope.at


class _Entry(Tracker):
    """A session's summary with where it stands in the order of last activity."""

    __slots__ = ("listed", "position")

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.position = 0
        self.listed: ListedStatus = "idle"


class Page(msgspec.Struct, frozen=True):
    """A page of the session list: its sessions, the cursor of the next page (None at the
    end) and how many sessions match the filter in all."""

    sessions: list[SessionSummary]
    next_cursor: int | None
    matched: int


class Catalog:
    """Every session of `log`, as `SessionSummary`s, read on by `catch_up`. With
    `reopen`, the log is opened anew (at most every second, and less often the longer
    opening takes) to see what another process has appended since."""

    def __init__(self, log: EventLog, *, reopen: Reopen | None = None, page: int = _PAGE) -> None:
        self.log = log
        self._reopen = reopen
        self._reopened_at = time.monotonic()
        self._reopen_every = _REOPEN_SECONDS
        self._page = page
        self._entries: dict[str, _Entry] = {}
        # The entries in the order of their last events' positions, and those positions:
        # a session's next events move it to the end.
        self._order: list[_Entry] = []
        self._positions: list[int] = []
        self._counts: Counter[ListedStatus] = Counter()
        self._after = 0
        self._indexing = True
        # Whether the log is read session by session (it holds damage), and the index of
        # the session in `sessions()` that the next such read starts at.
        self._by_session = False
        self._next_session = 0
        self._lock = anyio.Lock()

    @property
    def indexing(self) -> bool:
        """Whether the last `catch_up` stopped before the end of the log."""
        return self._indexing

    @property
    def total(self) -> int:
        return len(self._entries)

    def counts(self) -> dict[ListedStatus, int]:
        """How many sessions have each status (statuses no session has are left out)."""
        return {status: count for status, count in self._counts.items() if count}

    async def catch_up(self, budget: float) -> None:
        """Read what the log has appended since the last call, for up to about `budget`
        seconds (at least one page). LogError if the log cannot be read.

        A log whose whole read meets a damaged session (LogCorrupt, SeqError) is read on
        session by session from then on: each damaged session is listed `unreadable`,
        with why, and the others as ever."""
        async with self._lock:
            await self._reopen_if_due()
            deadline = anyio.current_time() + budget
            if not self._by_session:
                try:
                    await self._read_on(deadline)
                except (LogCorrupt, SeqError) as exc:
                    _log.warning("inspector.damaged_log", error=str(exc))
                    self._by_session = True
            if self._by_session:
                await self._read_on_by_session(deadline)

    async def _read_on(self, deadline: float) -> None:
        """Read the log on by position, page after page, until its end or `deadline`."""
        while True:
            found = await self.log.read_all(after=self._after, limit=self._page)
            if found:
                self._take(found)
                self._after = found[-1][0]
            self._indexing = len(found) == self._page
            if not self._indexing or anyio.current_time() >= deadline:
                return

    async def _read_on_by_session(self, deadline: float) -> None:
        """Read each session of the log on from its last seq seen, until `deadline` (at
        least one session), listing a damaged one `unreadable`. The events are taken in
        the order of their times, at positions of the catalog's own past the log's last
        (a log read this way is not read by position again)."""
        found: list[Envelope] = []
        ids = await self.log.sessions()
        start = self._next_session if self._next_session < len(ids) else 0
        self._indexing = False
        for index in range(start, len(ids)):
            session_id = ids[index]
            entry = self._entries.get(session_id)
            if entry is not None and entry.unreadable is not None:
                continue  # Damaged for good: nothing after the damage counts.
            try:
                found += await self.log.read(session_id, after=0 if entry is None else entry.seq)
            except (LogCorrupt, SeqError) as exc:
                self._unreadable(session_id, str(exc))
            if anyio.current_time() >= deadline and index + 1 < len(ids):
                self._next_session, self._indexing = index + 1, True
                break
        else:
            self._next_session = 0
        found.sort(key=_at)
        positions = range(self._after + 1, self._after + 1 + len(found))
        if found:
            self._take(list(zip(positions, found, strict=True)))
            self._after = positions[-1]

    def _unreadable(self, session_id: str, reason: str) -> None:
        """List the session `unreadable`, with `reason`, as its latest activity."""
        entry = self._entries.get(session_id)
        before: ListedStatus | None = None
        if entry is None:
            entry = self._entries[session_id] = _Entry(session_id)
        else:
            before = entry.listed
        entry.unreadable = reason
        self._after += 1
        self._relist({session_id: before}, {session_id: self._after})

    async def _reopen_if_due(self) -> None:
        if self._reopen is None or time.monotonic() - self._reopened_at < self._reopen_every:
            return
        started = time.monotonic()
        # The one replaced is read-only and holds no file: it is left to the collector,
        # so a read still using it is not cut short.
        self.log = await self._reopen()
        self._reopened_at = time.monotonic()
        taken = self._reopened_at - started
        self._reopen_every = max(_REOPEN_SECONDS, _REOPEN_FACTOR * taken)

    def _take(self, found: list[tuple[int, Envelope]]) -> None:
        """Fold a page of the log into the summaries and move each session it touches
        to its new place in the order."""
        entries = self._entries
        before: dict[str, ListedStatus | None] = {}
        last: dict[str, int] = {}
        # A bulk load (see `gc_paused`): summaries that stay, for as long as the sessions do.
        with gc_paused():
            for position, envelope in found:
                session_id = envelope.session_id
                entry = entries.get(session_id)
                if entry is None:
                    entry = entries[session_id] = _Entry(session_id)
                    before[session_id] = None
                elif session_id not in before:
                    before[session_id] = entry.listed
                entry.apply(envelope)
                last[session_id] = position
        self._relist(before, last)

    def _relist(self, before: dict[str, ListedStatus | None], last: dict[str, int]) -> None:
        """Count the sessions of `before` (each with its status before, None if new) by
        their statuses now, and move each to its place in the order by its last position
        (in `last`, each past every position in the order)."""
        entries = self._entries
        for session_id, old in before.items():
            entry = entries[session_id]
            entry.listed = entry.status
            if old is not None:
                self._counts[old] -= 1
            self._counts[entry.listed] += 1
        # Every position of the page is past every position in the order: removed from
        # where they were, the sessions go to the end in the order of their last events.
        order, positions = self._order, self._positions
        for session_id in sorted(last, key=last.__getitem__):
            entry = entries[session_id]
            if entry.position:
                index = bisect_left(positions, entry.position)
                del order[index], positions[index]
            entry.position = last[session_id]
            order.append(entry)
            positions.append(entry.position)

    def page(
        self,
        *,
        status: ListedStatus | None = None,
        search: str | None = None,
        limit: int,
        cursor: int | None = None,
    ) -> Page:
        """The sessions most recently active first, with `status` and an id holding
        `search` (any case), at most `limit` of them, from after `cursor` (the
        `next_cursor` of the page before)."""
        needle = search.casefold() if search else None
        order = self._order
        start = len(order) if cursor is None else bisect_left(self._positions, cursor)
        picked: list[_Entry] = []
        matched = 0
        for index in range(start - 1, -1, -1):
            entry = order[index]
            if status is not None and entry.listed != status:
                continue
            if needle is not None and needle not in entry.session_id.casefold():
                continue
            if len(picked) <= limit:
                picked.append(entry)
            elif needle is None:
                # The rest is counted by status, without going through it.
                break
            matched += 1
        if needle is None:
            matched = self._counts[status] if status is not None else len(order)
        elif cursor is not None:
            # Counted over the whole list, not only past the cursor.
            matched = sum(
                1
                for entry in order
                if (status is None or entry.listed == status)
                and needle in entry.session_id.casefold()
            )
        more = len(picked) > limit
        shown = picked[:limit]
        return Page(
            [entry.summary() for entry in shown],
            shown[-1].position if more else None,
            matched,
        )

    def summary(self, session_id: str) -> SessionSummary:
        """The session's summary; UnknownSession if the log had none by the last
        `catch_up`."""
        entry = self._entries.get(session_id)
        if entry is None:
            raise UnknownSession(f"no session {session_id!r} in the log")
        return entry.summary()

    async def read(self, session_id: str) -> list[Envelope]:
        """Every event of the session; UnknownSession if it has none, SessionUnreadable if
        its events are damaged."""
        await self.check(session_id)
        return await self._read(session_id)

    async def _read(self, session_id: str, after: int = 0) -> list[Envelope]:
        """The session's events after seq `after`; SessionUnreadable, saying why, if they
        are damaged (for good: not a failing log, which is a LogError)."""
        try:
            return await self.log.read(session_id, after=after)
        except (LogCorrupt, SeqError) as exc:
            raise SessionUnreadable(session_id, str(exc)) from None

    async def check(self, session_id: str) -> None:
        """Raise UnknownSession unless the log holds events of the session (looking again
        once the log is read on, for a session just begun elsewhere)."""
        if await self.log.last_seq(session_id):
            return
        await self.catch_up(budget=0.0)
        if not await self.log.last_seq(session_id):
            raise UnknownSession(f"no session {session_id!r} in the log")

    async def events(self, session_id: str, *, after: int = 0, wait: float = 0.0) -> list[Envelope]:
        """The session's events after seq `after`, waiting up to `wait` seconds for one
        (looking at the log twice a second); UnknownSession if it has none."""
        await self.check(session_id)
        deadline = anyio.current_time() + wait
        while True:
            found = await self._read(session_id, after)
            remaining = deadline - anyio.current_time()
            if found or remaining <= 0:
                return found
            await anyio.sleep(min(_TAIL_SECONDS, remaining))
            await self.catch_up(budget=0.0)
