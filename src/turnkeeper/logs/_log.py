"""The event log interface: append a session's events with an expected seq, read them back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Literal, Self

import anyio
import msgspec

from turnkeeper.core import LogCorrupt, LogError, SeqError, UnloggableEvent, encodes
from turnkeeper.events import Envelope, decode_envelope, decode_envelopes, encode_envelope


class SeqConflict(LogError):
    """An append's expected seq is not the session's last logged seq (someone else appended)."""

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"session {session_id}: append expected last seq {expected}, "
            f"but the log's last seq is {actual}"
        )
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class Batch(msgspec.Struct, frozen=True):
    """A checked append: one session's events numbered on from `expected_seq`, and their JSON.
    The events are as they will read back, or for a store that keeps only the JSON, as
    given (see `check_batch`)."""

    session_id: str
    expected_seq: int
    events: tuple[Envelope, ...]
    lines: tuple[bytes, ...]


# Seqs, positions and limits are SQLite integers, which stop here.
LARGEST_SEQ = 2**63 - 1


def check_batch(events: Sequence[Envelope], expected_seq: int, *, read_back: bool = True) -> Batch:
    """Validate an append and encode it; the batch holds the events as they will read back,
    or with `read_back` false, as given: a store that keeps only the JSON, and reads only
    each event's seq, time and type from the batch (the same either way), then holds no
    second copy of the events while the append waits.

    Raises LogError for anything that is not a non-empty run of one session's envelopes
    numbered expected_seq + 1, + 2, ..., or that would not read back (a NaN time, say).
    """
    if isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 0:
        raise LogError(f"expected_seq must be an int >= 0, got {expected_seq!r}")
    given: object = events
    if isinstance(given, str | bytes) or not isinstance(given, Sequence):
        raise LogError(f"events must be a sequence of Envelope, got {type(given).__name__}")
    if not events:
        raise LogError("cannot append an empty batch of events")
    if expected_seq + len(events) > LARGEST_SEQ:
        raise LogError(f"expected_seq {expected_seq} numbers events past 2**63 - 1")
    first = events[0]
    if not isinstance(first, Envelope):
        raise LogError(f"events must be Envelope instances, got {type(first).__name__}")
    session_id = first.session_id
    lines: list[bytes] = []
    seq = expected_seq
    for envelope in events:
        if not isinstance(envelope, Envelope):
            raise LogError(f"events must be Envelope instances, got {type(envelope).__name__}")
        if envelope.session_id != session_id:
            raise LogError(
                f"one append holds one session's events: got {envelope.session_id!r} "
                f"after {session_id!r}"
            )
        seq += 1
        if envelope.seq != seq:
            raise SeqError(session_id, envelope.seq, seq)
        try:
            lines.append(encode_envelope(envelope))
        except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
            raise UnloggableEvent(
                f"session {session_id} seq {envelope.seq}: cannot encode event: {exc}"
            ) from None
    # The read-back check is a real decode: besides NaN and infinite floats (written as
    # null), a field of the wrong type or a payload value JSON cannot hold as it is (a
    # tuple, a non-string key, bytes) would read back differently or not at all, and only
    # walking every value could tell; msgspec's decode of the whole batch at once is the
    # cheapest such walk.
    try:
        decoded = decode_envelopes(lines, encoded_here=True)
    except LogCorrupt:
        for envelope, line in zip(events, lines, strict=True):
            try:
                decode_envelope(line)
            except LogCorrupt as exc:
                raise UnloggableEvent(
                    f"session {session_id} seq {envelope.seq}: event would not read back: {exc}"
                ) from None
        raise
    kept = tuple(decoded) if read_back else tuple(events)
    return Batch(session_id, expected_seq, kept, tuple(lines))


async def _yield() -> None:
    """Let other tasks run before a read: a log in memory would otherwise answer without
    ever yielding, and a task polling it would starve every other task (and its own
    timeouts)."""
    await anyio.lowlevel.checkpoint()


def check_window(after: int, limit: int | None) -> None:
    """Raise LogError unless `after` is an int >= 0 and `limit` is None or an int >= 0."""
    if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= LARGEST_SEQ:
        raise LogError(f"after must be an int from 0 to 2**63 - 1, got {after!r}")
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= LARGEST_SEQ
    ):
        raise LogError(f"limit must be None or an int from 0 to 2**63 - 1, got {limit!r}")


def check_session_id(session_id: str) -> None:
    """Raise LogError unless `session_id` is a non-empty string."""
    if not isinstance(session_id, str) or not session_id:
        raise LogError(f"session_id must be a non-empty string, got {session_id!r}")


class EventLog(ABC):
    """An append-only store of every session's events.

    Each session's events are numbered 1, 2, 3...; an append names the seq it expects
    the session to be at, so two writers cannot interleave a session. An append is
    durable before it returns. Every event also has a global position, increasing in
    append order, so a reader can tail the whole log with `read_all`.

    The log opens on first use (or on `async with`, which surfaces bad stored data at
    once) and `close` (or leaving the `async with`) waits for appends in flight.
    """

    # Whether the store keeps the decoded events of an append (a batch's `events` as they
    # will read back) rather than only their JSON.
    _keeps_events: ClassVar[bool] = True

    def __init__(self) -> None:
        self._state: Literal["new", "open", "closed"] = "new"
        self._open_lock = anyio.Lock()

    @property
    def writable(self) -> bool:
        """Whether this log can append: it is open (by `async with` or its first use, and
        not closed since) and writes its storage.

        A MemoryLog writes once open. A JsonlLog or SqliteLog writes only if it holds its
        storage's writer lock, which it tries to take as it opens and releases on `close`:
        one opened `read_only`, or opened while another log (in this process or another)
        held the lock, only reads, and its appends raise LogError saying why. Code that
        must write (a Host) opens the log first, then checks this.
        """
        return self._state == "open" and self._writes()

    async def __aenter__(self) -> Self:
        await self._ready()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def append(self, events: Sequence[Envelope], *, expected_seq: int) -> None:
        """Log one session's events, numbered on from `expected_seq` (0 for a new session).

        Raises SeqConflict if the session's last logged seq is not `expected_seq`, and
        LogError (SeqError for bad numbering) if the batch is not valid. If the append
        is cancelled, the events may or may not have been logged; `last_seq` tells.
        """
        batch = check_batch(events, expected_seq, read_back=self._keeps_events)
        if self._state != "open":
            await self._ready()
        await self._append(batch)

    async def read(
        self, session_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[Envelope]:
        """The session's events with seq > `after`, in order, at most `limit` of them.

        A session id that cannot be logged (one holding a lone surrogate) names no
        session, as no append of it gets past `check_batch`: it has no events.
        """
        check_session_id(session_id)
        check_window(after, limit)
        await self._ready()
        if limit == 0:
            return []
        await _yield()
        if not encodes(session_id):
            return []
        return await self._read(session_id, after, limit)

    async def last_seq(self, session_id: str) -> int:
        """The seq of the session's last logged event; 0 if it has none (or its id cannot
        be logged, see `read`)."""
        check_session_id(session_id)
        await self._ready()
        await _yield()
        if not encodes(session_id):
            return 0
        return await self._last_seq(session_id)

    async def sessions(self) -> list[str]:
        """Every session id in the log, in the order the sessions were created."""
        await self._ready()
        await _yield()
        return await self._sessions()

    async def read_all(
        self, *, after: int = 0, limit: int | None = None
    ) -> list[tuple[int, Envelope]]:
        """Events of every session at global positions > `after`, as (position, envelope)."""
        check_window(after, limit)
        await self._ready()
        if limit == 0:
            return []
        await _yield()
        return await self._read_all(after, limit)

    async def close(self) -> None:
        """Stop taking work, finish appends in flight and release the storage."""
        # Shielded: closing is what an `async with` does on its way out of a cancellation.
        with anyio.CancelScope(shield=True):
            # Under the lock: a second close returns once the first has finished.
            async with self._open_lock:
                was_open = self._state == "open"
                self._state = "closed"
                if was_open:
                    await self._close()

    async def _ready(self) -> None:
        """Open the log if this is its first use; raise LogError if it is closed."""
        if self._state == "new":
            async with self._open_lock:
                if self._state == "new":
                    await self._open()
                    self._state = "open"
        if self._state == "closed":
            raise LogError(f"{self!r} is closed")

    def _writes(self) -> bool:
        """Whether the open log writes its storage (see `writable`)."""
        return True

    @abstractmethod
    async def _open(self) -> None:
        """Open the storage (called once, before the first operation)."""

    @abstractmethod
    async def _close(self) -> None:
        """Finish work in flight and release the storage (called once, if opened)."""

    @abstractmethod
    async def _append(self, batch: Batch) -> None: ...

    @abstractmethod
    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]: ...

    @abstractmethod
    async def _last_seq(self, session_id: str) -> int: ...

    @abstractmethod
    async def _sessions(self) -> list[str]: ...

    @abstractmethod
    async def _read_all(self, after: int, limit: int | None) -> list[tuple[int, Envelope]]: ...
