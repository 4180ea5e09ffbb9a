"""An event log in one SQLite file (WAL mode): the embedded default."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from functools import partial
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, TypeVar

import anyio

from turnkeeper.events._errors import LogCorrupt, LogError, SeqError
from turnkeeper.events._events import Envelope
from turnkeeper.events._jsonl import decode_envelope, decode_envelopes, gc_paused
from turnkeeper.events._log import Batch, EventLog
from turnkeeper.events._sqlite_writer import Writer, last_seq, sqlite_error, transaction

_T = TypeVar("_T")

_SCHEMA_VERSION = 2
# A session is in the sessions table exactly when it has events: its first event puts it
# there, in the statement that inserts it. (Version 1 had no trigger: its writer inserted
# the row itself. Opening a version 1 file adds the trigger.)
_SESSIONS_TRIGGER = """CREATE TRIGGER IF NOT EXISTS session_opened AFTER INSERT ON events
    WHEN NEW.seq = 1
    BEGIN INSERT INTO sessions (session_id) VALUES (NEW.session_id); END"""
_SCHEMA = (
    """CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL UNIQUE
    )""",
    """CREATE TABLE events (
        pos INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        at REAL NOT NULL,
        type TEXT NOT NULL,
        body BLOB NOT NULL,
        UNIQUE (session_id, seq)
    )""",
    _SESSIONS_TRIGGER,
    f"PRAGMA user_version = {_SCHEMA_VERSION}",
)
_UPGRADE = (_SESSIONS_TRIGGER, f"PRAGMA user_version = {_SCHEMA_VERSION}")
# The session id is the one asked for: `_read` compares the bodies with it.
_READ = "SELECT seq, body FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
_READ_ALL = "SELECT pos, session_id, seq, body FROM events WHERE pos > ? ORDER BY pos LIMIT ?"
# A `_READ_ALL` row's position, and its session id and seq, which its envelope must have.
_position = itemgetter(0)
_row_names = itemgetter(1, 2)
_names = attrgetter("session_id", "seq")
_SESSIONS = "SELECT session_id FROM sessions ORDER BY id"
_BUSY_TIMEOUT_MS = 5000
# Rows per read: large enough that the worker-thread hop is cheap next to decoding the
# page, small enough that decoding one (on the event loop) stays within milliseconds.
_PAGE = 4096


class SqliteLog(EventLog):
    """An event log in the SQLite file at `path` (created if missing), in WAL mode.

    Group commit: appends that arrive while a transaction is being committed gather,
    and a writer thread commits all of them in the next transaction, as soon as the one
    before has committed, so many sessions share one fsync (see `Writer`). Each append's
    expected seq is checked inside the transaction; a conflict fails only that append.
    `commits` counts the transactions committed.

    Durability: `synchronous=FULL` fsyncs the WAL on every commit, so an append that
    has returned survives power loss, not only a crash of the process (with NORMAL,
    WAL commits since the last checkpoint can be lost); group commit pays for it.

    All database work runs in threads: writes on one connection in the writer's, reads
    on a second in worker threads, so reads never see a transaction in progress. Reads
    fetch pages of raw rows there and decode them on the calling thread, a page in one
    pass. Other processes may read the file while this one writes. Positions are the
    events' row ids, increasing in commit order and never reused.
    """

    _writer: Writer
    _reader: sqlite3.Connection
    _read_limiter: anyio.CapacityLimiter

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)

    @property
    def commits(self) -> int:
        """Transactions committed so far."""
        return self._writer.commits if self._state != "new" else 0

    def __repr__(self) -> str:
        return f"SqliteLog({str(self.path)!r})"

    async def _open(self) -> None:
        self._read_limiter = anyio.CapacityLimiter(1)
        writer, self._reader = await anyio.to_thread.run_sync(_connect, self.path)
        self._writer = Writer(writer, self.path)

    async def _close(self) -> None:
        await self._writer.close()
        await anyio.to_thread.run_sync(self._reader.close, limiter=self._read_limiter)

    async def _append(self, batch: Batch) -> None:
        await self._writer.append(batch)

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        events: list[Envelope] = []
        while True:
            size = _PAGE if limit is None else min(limit - len(events), _PAGE)
            parameters = (session_id, after + len(events), size)
            # One pause of the cycle collector for the rows and the envelopes they hold.
            with gc_paused():
                rows = await self._on_reader(partial(_fetch, _READ, parameters))
                page = _decode_page(self.path, rows, session_id)
            expected = after + len(events) + 1
            for (seq, _), envelope in zip(rows, page, strict=True):
                if envelope.session_id != session_id or envelope.seq != seq:
                    raise _mismatch(self.path, session_id, seq, envelope)
                if seq != expected:
                    error = SeqError(session_id, seq, expected)
                    error.args = (f"{self.path}: {error}",)
                    raise error
                expected += 1
            events.extend(page)
            if len(rows) < size or len(events) == limit:
                return events

    async def _last_seq(self, session_id: str) -> int:
        return await self._on_reader(lambda connection: last_seq(connection, self.path, session_id))

    async def _sessions(self) -> list[str]:
        def sessions(connection: sqlite3.Connection) -> list[str]:
            ids = [row[0] for row in connection.execute(_SESSIONS)]
            for session_id in ids:
                if not isinstance(session_id, str):
                    raise LogCorrupt(f"{self.path}: session id {session_id!r} is not text")
            return ids

        return await self._on_reader(sessions)

    async def _read_all(self, after: int, limit: int | None) -> list[tuple[int, Envelope]]:
        # Page after page by position: each commit's rows follow every earlier commit's, so
        # the pages join into what one read at the end would have returned (with a limit).
        found: list[tuple[int, Envelope]] = []
        while True:
            size = _PAGE if limit is None else min(limit - len(found), _PAGE)
            with gc_paused():
                rows = await self._on_reader(partial(_fetch, _READ_ALL, (after, size)))
                page = _decode_page(self.path, rows)
                # Compared a page at a time; a page that differs is walked to name its row.
                if list(map(_names, page)) != list(map(_row_names, rows)):
                    raise _first_mismatch(self.path, rows, page)
                found += zip(map(_position, rows), page, strict=True)
            if len(rows) < size or len(found) == limit:
                return found
            after = found[-1][0]

    async def _on_reader(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `work` on the read connection in a worker thread, one at a time."""

        def guarded() -> _T:
            try:
                return work(self._reader)
            except sqlite3.Error as exc:
                raise sqlite_error(self.path, exc) from None

        return await anyio.to_thread.run_sync(guarded, limiter=self._read_limiter)


def _connect(path: Path) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """Open the writer and reader connections, making the schema if the file is new."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LogError(f"{path}: cannot make its directory: {exc}") from None
    connections: list[sqlite3.Connection] = []
    try:
        for _ in range(2):
            connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            connections.append(connection)
            _configure(connection, path)
        _ensure_schema(connections[0], path)
    except BaseException as exc:
        for connection in connections:
            connection.close()
        if isinstance(exc, sqlite3.Error):
            raise sqlite_error(path, exc) from None
        raise
    return connections[0], connections[1]


def _configure(connection: sqlite3.Connection, path: Path) -> None:
    """WAL mode, a full fsync per commit, and waiting (not failing) on another writer's lock."""
    connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    (mode,) = connection.execute("PRAGMA journal_mode = WAL").fetchone()
    if str(mode).lower() != "wal":
        raise LogError(f"{path}: cannot use WAL mode (journal mode is {mode})")
    connection.execute("PRAGMA synchronous = FULL")


def _ensure_schema(connection: sqlite3.Connection, path: Path) -> None:
    """Create the tables in a new file, upgrade a version 1 file; refuse any other schema."""
    if _user_version(connection) == _SCHEMA_VERSION:
        return
    with transaction(connection):
        _create_schema(connection, path)


def _create_schema(connection: sqlite3.Connection, path: Path) -> None:
    """Inside a write transaction: create or upgrade the schema unless another process
    just did."""
    version = _user_version(connection)
    if version == _SCHEMA_VERSION:
        return
    if version not in (0, 1):
        raise LogError(f"{path}: schema version {version} is not turnkeeper's ({_SCHEMA_VERSION})")
    for statement in _SCHEMA if version == 0 else _UPGRADE:
        connection.execute(statement)


def _user_version(connection: sqlite3.Connection) -> int:
    (version,) = connection.execute("PRAGMA user_version").fetchone()
    return int(version)


def _fetch(query: str, parameters: tuple[object, ...], connection: sqlite3.Connection) -> list[Any]:
    """In a worker thread: a page of rows, the body last."""
    return connection.execute(query, parameters).fetchall()


def _decode_page(path: Path, rows: list[Any], session_id: str | None = None) -> list[Envelope]:
    """The envelopes in a page of rows: each row ends with its session id, seq and body,
    or only its seq and body when every row is of `session_id`.

    All the bodies decode in one pass unless one of them is bad; then each row decodes
    alone, so the error names the first bad one. The caller checks the columns.
    """
    try:
        return decode_envelopes([row[-1] for row in rows])
    except LogCorrupt:
        if session_id is None:
            return [_decode_row(path, *row[-3:]) for row in rows]
        return [_decode_row(path, session_id, *row) for row in rows]


def _decode_row(path: Path, session_id: Any, seq: Any, body: Any) -> Envelope:
    """The envelope stored in a row; LogCorrupt unless it decodes and matches its columns."""
    try:
        envelope = decode_envelope(body)
    except LogCorrupt as exc:
        raise LogCorrupt(f"{path}: session {session_id} seq {seq}: {exc}") from None
    if envelope.session_id != session_id or envelope.seq != seq:
        raise _mismatch(path, session_id, seq, envelope)
    return envelope


def _mismatch(path: Path, session_id: Any, seq: Any, envelope: Envelope) -> LogCorrupt:
    return LogCorrupt(
        f"{path}: session {session_id} seq {seq}: body holds session "
        f"{envelope.session_id} seq {envelope.seq} instead"
    )


def _first_mismatch(path: Path, rows: list[Any], page: list[Envelope]) -> LogCorrupt:
    """The error naming the first of `rows` (position, session id, seq, body) whose envelope
    in `page` is not of its session id and seq."""
    for (_, session_id, seq, _), envelope in zip(rows, page, strict=True):
        if envelope.session_id != session_id or envelope.seq != seq:
            return _mismatch(path, session_id, seq, envelope)
    raise AssertionError("every envelope matches its row")
