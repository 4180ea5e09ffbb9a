"""The PostgreSQL log's writer: a thread that commits appends in rounds, one after another."""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

from turnkeeper.core import LogCorrupt, LogError
from turnkeeper.logs._log import SeqConflict
from turnkeeper.logs._shared import FenceLost

# Parameters in binary (%b), the arrays packed here (see `_Packed`).
_APPEND = (
    "SELECT batch, code, actual, epoch, owner_name FROM turnkeeper_append("
    "%b, %b::text[], %b::bigint[], %b::bigint[], %b::integer[], %b::integer[], "
    "%b::integer[], %b::text, %b::double precision[], %b::text[], %b::integer[], "
    "%b::bigint[], %b::integer[], %b::bigint[], %b::text[], %b)"
)
# Rounds committed at once, each by a thread on a connection of its own: while one
# round's commit is flushed, the next is written.
IN_FLIGHT = 2
_DEADLOCK_RETRIES = 3
_WRITTEN, _SEQ_CONFLICT, _FENCE_LOST, _NOT_CONSUMABLE = 0, 1, 2, 3


class Write:
    """One session's write on its way to the database: its events (their JSON lines,
    times and types; perhaps none), the epoch the log held the session at when it was
    asked for (0: none; the write claims the session), and the inbox items it consumes
    with their outcomes. Once its round settles: `error`, or the epoch it was written under.
    """

    __slots__ = (
        "ats",
        "consumes",
        "epoch",
        "error",
        "expected_seq",
        "held",
        "lines",
        "owner",
        "session_id",
        "types",
    )

    def __init__(
        self,
        session_id: str,
        expected_seq: int,
        lines: tuple[bytes, ...],
        ats: list[float],
        types: list[str],
        held: int,
        consumes: tuple[tuple[int, str | None], ...] = (),
    ) -> None:
        self.session_id = session_id
        self.expected_seq = expected_seq
        self.lines = lines
        self.ats = ats
        self.types = types
        self.held = held
        self.consumes = consumes
        self.error: LogError | None = None
        self.epoch = 0
        self.owner: str | None = None


class _Round:
    """Writes committed in one transaction; their tasks wait on `done`."""

    __slots__ = ("done", "settled", "taken", "writes")

    def __init__(self) -> None:
        self.writes: list[Write] = []
        # Set by the writer thread, under its lock, when it takes the round.
        self.taken = False
        self.settled = False
        self.done = anyio.Event()


class Writer:
    """Commits writes in threads of its own (IN_FLIGHT of them), each on a connection of
    its own (made by `connect`, and made again once the server has dropped it).

    Writes gather in a round while the rounds before commit; as soon as a thread is free,
    it takes the gathered round, with no trip through the event loop in between. Two
    rounds in flight overlap one's flush with the next one's work; the positions still
    follow commit order (see the schema's head row), and a session's writes in two rounds
    wait for each other on its row's lock. A round is one call of the schema's
    `turnkeeper_append`, in its own transaction: one trip to the server, one WAL flush
    for every write in it. Each write is fenced and
    checked against its session's row in that transaction, so a conflict fails only that
    write. Once committed, the thread hands the round to the event loop (`settle`, which
    runs there before the round's tasks wake).
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        where: str,
        worker: int,
        channel: str,
        settle: Callable[[list[Write]], None],
    ) -> None:
        self.where = where
        self.commits = 0
        self._connect = connect
        self._worker = worker
        self._channel = channel
        self._settle_writes = settle
        self._token = anyio.lowlevel.current_token()
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._gathering: _Round | None = None
        self._closing = False
        # The event loop's own: rounds not settled yet, oldest first.
        self._unsettled: dict[_Round, None] = {}
        self._threads = [
            threading.Thread(
                target=self._commit_rounds,
                name=f"turnkeeper PostgreSQL writer {where}",
                daemon=True,
            )
            for _ in range(IN_FLIGHT)
        ]
        for thread in self._threads:
            thread.start()

    async def write(self, write: Write) -> None:
        """Commit `write` in the next round; raises its LogError (SeqConflict, FenceLost...).

        Cancelled before its round is taken, the write is not made; after, it is, and the
        cancellation waits for the commit: once it is raised, `last_seq` tells.
        """
        with self._lock:
            round_ = self._gathering
            if round_ is None:
                round_ = self._gathering = _Round()
                self._unsettled[round_] = None
                self._work.notify()
            round_.writes.append(write)
        try:
            await round_.done.wait()
        except BaseException:
            with self._lock:
                taken = round_.taken
                if not taken:
                    round_.writes.remove(write)
            if taken:
                with anyio.CancelScope(shield=True):
                    await round_.done.wait()
            raise
        if write.error is not None:
            raise write.error

    async def close(self) -> None:
        """Wait for every write in flight, then stop the thread (which closes the
        connection)."""
        while self._unsettled:
            await next(iter(self._unsettled)).done.wait()
        with self._work:
            self._closing = True
            self._work.notify_all()
        for thread in self._threads:
            await anyio.to_thread.run_sync(thread.join)

    def _settle(self, round_: _Round) -> None:
        """On the event loop: the round's outcomes are in; wake its tasks."""
        round_.settled = True
        del self._unsettled[round_]
        self._settle_writes(round_.writes)
        round_.done.set()

    def _commit_rounds(self) -> None:
        """In the writer thread: commit whatever has queued, round after round, until closed."""
        connection: list[psycopg.Connection[Any]] = []
        try:
            self._take_rounds(connection)
        finally:
            for made in connection:
                made.close()

    def _take_rounds(self, connection: list[psycopg.Connection[Any]]) -> None:
        while True:
            with self._work:
                while self._gathering is None and not self._closing:
                    self._work.wait()
                round_ = self._gathering
                if round_ is None:
                    return
                self._gathering = None
                round_.taken = True
            if round_.writes:
                try:
                    self._commit(round_.writes, connection)
                except Exception as exc:
                    # A bug, not a database error: each write hears of it, and the thread goes on.
                    for write in round_.writes:
                        write.error = LogError(f"{self.where}: the writer failed: {exc!r}")
            token = self._token
            token.backend_class.run_sync_soon(self._settle, (round_,), token.native_token)

    def _commit(self, round_writes: list[Write], made: list[psycopg.Connection[Any]]) -> None:
        """Write the round in one transaction, setting each write's outcome."""
        # In each group, by session: rounds in flight at once lock their sessions' rows in
        # one order (a session's later writes stay in later groups).
        grouped = sorted(
            zip(_groups(round_writes), round_writes, strict=True), key=_group_and_session
        )
        groups = [group for group, _ in grouped]
        writes = [write for _, write in grouped]
        bodies: list[bytes] = []
        ats: list[float] = []
        types: list[bytes] = []
        batches: list[int] = []
        seqs: list[int] = []
        c_batch: list[int] = []
        c_item: list[int] = []
        c_outcome: list[str | None] = []
        for index, write in enumerate(writes, start=1):
            bodies.extend(write.lines)
            ats.extend(write.ats)
            types.extend(map(_type_element, write.types))
            batches += [index] * len(write.lines)
            seqs.extend(range(write.expected_seq + 1, write.expected_seq + len(write.lines) + 1))
            for item, outcome in write.consumes:
                c_batch.append(index)
                c_item.append(item)
                c_outcome.append(outcome)
        parameters = (
            self._worker,
            _texts([write.session_id.encode() for write in writes]),
            _int8s([write.expected_seq for write in writes]),
            _int8s([write.held for write in writes]),
            _int4s([len(write.lines) for write in writes]),
            _int4s(groups),
            _int4s([len(write.consumes) for write in writes]),
            _Text(b"\n".join(bodies)),
            _float8s(ats),
            _Texts(_HEADER.pack(1, 0, _TEXT, len(types), 1) + b"".join(types)),
            _int4s(batches),
            _int8s(seqs),
            _int4s(c_batch),
            _int8s(c_item),
            _texts([None if outcome is None else outcome.encode() for outcome in c_outcome]),
            self._channel,
        )
        try:
            if made and made[0].broken:
                made.pop().close()
            if not made:
                try:
                    made.append(_packing(self._connect()))
                except psycopg.Error as exc:
                    raise _Unconnected(exc) from None
            rows = _execute(made[0], parameters)
        except _Unconnected as exc:
            failure: LogError = database_error(self.where, exc.error)
            rows = []
        except psycopg.errors.UniqueViolation as exc:
            failure = LogCorrupt(
                f"{self.where}: the events table holds seqs past a session's last seq "
                f"(changed by hand?); nothing of this commit was written: {exc}"
            )
            rows = []
        except psycopg.Error as exc:
            failure = database_error(self.where, exc, writing=True)
            rows = []
        else:
            failure = LogError(f"{self.where}: the append function returned no outcome")
        for write in writes:
            write.error = failure
        written = False
        for batch, code, actual, epoch, owner in rows:
            write = writes[batch - 1]
            write.error = None
            write.epoch = epoch
            write.owner = owner
            if code == _WRITTEN:
                written = True
            elif code == _SEQ_CONFLICT:
                write.error = SeqConflict(write.session_id, write.expected_seq, actual)
            elif code == _FENCE_LOST:
                write.error = FenceLost(
                    write.session_id, held=write.held or None, owner=owner, epoch=epoch
                )
            else:
                items = ", ".join(str(item) for item, _ in write.consumes)
                write.error = LogError(
                    f"session {write.session_id}: inbox items {items}: one is consumed "
                    "already or is not this session's; nothing was written"
                )
        if written:
            with self._lock:
                self.commits += 1


def _execute(connection: psycopg.Connection[Any], parameters: tuple[Any, ...]) -> list[Any]:
    """Call the round's function; again if the server broke a deadlock by rolling it back
    (nothing of it was written), as it may when two rounds lock the same sessions."""
    for attempt in range(_DEADLOCK_RETRIES + 1):
        try:
            return connection.execute(_APPEND, parameters).fetchall()
        except psycopg.errors.DeadlockDetected:
            if attempt == _DEADLOCK_RETRIES:
                raise
    raise AssertionError("the last attempt returns or raises")


def _group_and_session(grouped: tuple[int, Write]) -> tuple[int, str]:
    return grouped[0], grouped[1].session_id


def _groups(writes: list[Write]) -> list[int]:
    """The group of each write (1, 2, ...), in order: a new group whenever a session
    comes again, since each write is checked against its session's row as it was before
    its group's statement."""
    groups: list[int] = []
    group = 1
    sessions: set[str] = set()
    for write in writes:
        if write.session_id in sessions:
            group += 1
            sessions = set()
        sessions.add(write.session_id)
        groups.append(group)
    return groups


# A round's arrays, in PostgreSQL's binary format, packed here by struct: psycopg's dumper
# of a list (in Python, an element at a time, after a scan for the type to send) took 0.4
# to 0.7 ms of the 0.5 to 1 ms this thread spent on a round of 100 appends, holding the GIL
# the event loop needs; packed, the round takes 0.25 ms. Each is a bytes subclass that
# `_packing` has the connection send as it is.
_HEADER = struct.Struct(">iiiii")  # dimensions, has nulls, element type, length, lower bound
_LENGTH = struct.Struct(">i").pack
_NULL = _LENGTH(-1)
_INT4, _INT8, _FLOAT8, _TEXT = 23, 20, 701, 25


class _Packed(bytes):
    """A parameter already in PostgreSQL's binary format."""

    __slots__ = ()
    oid = 0


class _Int4s(_Packed):
    __slots__ = ()
    oid = 1007


class _Int8s(_Packed):
    __slots__ = ()
    oid = 1016


class _Float8s(_Packed):
    __slots__ = ()
    oid = 1022


class _Texts(_Packed):
    __slots__ = ()
    oid = 1009


class _Text(_Packed):
    """UTF-8 text, sent as it is (the binary format of text)."""

    __slots__ = ()
    oid = _TEXT


def _fixed(element: int, code: str, size: int, values: Sequence[float]) -> bytes:
    """A one-dimensional array of fixed-size elements: each its length, then itself."""
    pairs: list[float] = [size, 0] * len(values)
    pairs[1::2] = values
    header = _HEADER.pack(1, 0, element, len(values), 1)
    return header + struct.pack(f">{('i' + code) * len(values)}", *pairs)


def _int4s(values: Sequence[int]) -> _Int4s:
    return _Int4s(_fixed(_INT4, "i", 4, values))


def _int8s(values: Sequence[int]) -> _Int8s:
    return _Int8s(_fixed(_INT8, "q", 8, values))


def _float8s(values: Sequence[float]) -> _Float8s:
    return _Float8s(_fixed(_FLOAT8, "d", 8, values))


def _texts(values: Sequence[bytes | None]) -> _Texts:
    """An array of text, from UTF-8 (None: NULL)."""
    header = _HEADER.pack(1, int(None in values), _TEXT, len(values), 1)
    return _Texts(
        header
        + b"".join([_NULL if value is None else _LENGTH(len(value)) + value for value in values])
    )


@functools.lru_cache(maxsize=1024)
def _type_element(type_: str) -> bytes:
    """An event type as an element of a text array (the few types recur in every round)."""
    encoded = type_.encode()
    return _LENGTH(len(encoded)) + encoded


class _PackedDumper(Dumper):
    """Sends a `_Packed` parameter as it is, as its class's type."""

    format = Format.BINARY

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        assert issubclass(cls, _Packed)
        self.oid = cls.oid

    def dump(self, obj: Any) -> bytes:
        assert isinstance(obj, _Packed)
        return obj


def _packing(connection: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The connection, made to send `_Packed` parameters as they are."""
    for packed in (_Int4s, _Int8s, _Float8s, _Texts, _Text):
        connection.adapters.register_dumper(packed, _PackedDumper)
    return connection


class _Unconnected(Exception):
    """No connection could be made for a round (so nothing of it was sent)."""

    def __init__(self, error: psycopg.Error) -> None:
        self.error = error


def database_error(where: str, exc: Exception, *, writing: bool = False) -> LogError:
    """A turnkeeper error for a failure of the database or of the connection to it."""
    text = str(exc).strip() or type(exc).__name__
    if writing and isinstance(exc, psycopg.OperationalError):
        # The commit may have been sent before the connection failed.
        text += " (the write may or may not have been logged: last_seq tells)"
    return LogError(f"{where}: {text}")
