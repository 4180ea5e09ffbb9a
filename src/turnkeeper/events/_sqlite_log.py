"""An event log in one SQLite file (WAL mode): the embedded default."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from turnkeeper.events._errors import LogCorrupt, LogError, SeqError
from turnkeeper.events._events import Envelope
from turnkeeper.events._jsonl import decode_envelope
from turnkeeper.events._log import Batch, EventLog, SeqConflict

_T = TypeVar("_T")

_SCHEMA_VERSION = 1
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
    f"PRAGMA user_version = {_SCHEMA_VERSION}",
)
_LAST_SEQ = "SELECT max(seq) FROM events WHERE session_id = ?"
_INSERT_SESSION = "INSERT INTO sessions (session_id) VALUES (?)"
_INSERT_EVENT = "INSERT INTO events (session_id, seq, at, type, body) VALUES (?, ?, ?, ?, ?)"
_READ = (
    "SELECT session_id, seq, body FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)
_READ_ALL = "SELECT pos, session_id, seq, body FROM events WHERE pos > ? ORDER BY pos LIMIT ?"
_SESSIONS = "SELECT session_id FROM sessions ORDER BY id"
_BUSY_TIMEOUT_MS = 5000


class _Pending:
    """An append waiting for a group commit, and its outcome once committed."""

    __slots__ = ("batch", "done", "error")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.done = False
        self.error: LogError | None = None


class SqliteLog(EventLog):
    """An event log in the SQLite file at `path` (created if missing), in WAL mode.

    Group commit: appends that arrive while a transaction is being committed queue
    up, and the next transaction commits all of them at once, so many sessions share
    one fsync. Each append's expected seq is checked inside that transaction; a
    conflict fails only that append. `commits` counts the transactions committed.

    Durability: `synchronous=FULL` fsyncs the WAL on every commit, so an append that
    has returned survives power loss, not only a crash of the process (with NORMAL,
    WAL commits since the last checkpoint can be lost); group commit pays for it.

    All database work runs in worker threads: writes on one connection, reads on a
    second, so reads never see a transaction in progress. Other processes may read
    the file while this one writes. Positions are the events' row ids, increasing in
    commit order and never reused.
    """

    _writer: sqlite3.Connection
    _reader: sqlite3.Connection
    _write_limiter: anyio.CapacityLimiter
    _read_limiter: anyio.CapacityLimiter
    _round_done: anyio.Event

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self.commits = 0
        self._queue: list[_Pending] = []
        self._committing = False

    def __repr__(self) -> str:
        return f"SqliteLog({str(self.path)!r})"

    async def _open(self) -> None:
        self._write_limiter = anyio.CapacityLimiter(1)
        self._read_limiter = anyio.CapacityLimiter(1)
        self._writer, self._reader = await anyio.to_thread.run_sync(_connect, self.path)

    async def _close(self) -> None:
        while self._committing or self._queue:
            if self._committing:
                await self._round_done.wait()
            else:
                await self._commit_round()
        await anyio.to_thread.run_sync(self._reader.close, limiter=self._read_limiter)
        await anyio.to_thread.run_sync(self._writer.close, limiter=self._write_limiter)

    async def _append(self, batch: Batch) -> None:
        pending = _Pending(batch)
        self._queue.append(pending)
        try:
            while not pending.done:
                if self._committing:
                    await self._round_done.wait()
                else:
                    await self._commit_round()
        finally:
            if not pending.done and pending in self._queue:
                self._queue.remove(pending)
        if pending.error is not None:
            raise pending.error

    async def _commit_round(self) -> None:
        """Commit every queued append in one transaction and settle each one's outcome."""
        self._committing = True
        round_done = self._round_done = anyio.Event()
        taken: list[_Pending] = []
        outcomes: list[LogError | None] = []
        try:
            # Whoever leads the round finishes it, even if cancelled: the others wait on it.
            with anyio.CancelScope(shield=True):
                # Appenders that are ready to run (woken by the last round, say) join this one.
                await anyio.lowlevel.checkpoint()
                taken, self._queue = self._queue, []
                outcomes = [LogError(f"{self.path}: append failed unexpectedly") for _ in taken]
                if taken:
                    outcomes = await anyio.to_thread.run_sync(
                        self._commit,
                        [pending.batch for pending in taken],
                        limiter=self._write_limiter,
                    )
        finally:
            for pending, outcome in zip(taken, outcomes, strict=True):
                pending.done = True
                pending.error = outcome
            self._committing = False
            round_done.set()

    def _commit(self, batches: list[Batch]) -> list[LogError | None]:
        """In a worker thread: write every batch whose expected seq holds, in one transaction."""
        connection = self._writer
        outcomes: list[LogError | None] = []
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                for batch in batches:
                    actual = _last_seq(connection, self.path, batch.session_id)
                    if actual != batch.expected_seq:
                        outcomes.append(SeqConflict(batch.session_id, batch.expected_seq, actual))
                        continue
                    if actual == 0:
                        connection.execute(_INSERT_SESSION, (batch.session_id,))
                    connection.executemany(
                        _INSERT_EVENT,
                        [
                            (envelope.session_id, envelope.seq, envelope.at, envelope.type, line)
                            for envelope, line in zip(batch.events, batch.lines, strict=True)
                        ],
                    )
                    outcomes.append(None)
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            return [_error(self.path, exc) for _ in batches]
        except LogCorrupt as exc:
            return [LogCorrupt(str(exc)) for _ in batches]
        if None in outcomes:
            self.commits += 1
        return outcomes

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        def read(connection: sqlite3.Connection) -> list[Envelope]:
            rows = connection.execute(_READ, (session_id, after, _sql_limit(limit))).fetchall()
            events = [_decode_row(self.path, *row) for row in rows]
            for expected, envelope in enumerate(events, start=after + 1):
                if envelope.seq != expected:
                    error = SeqError(session_id, envelope.seq, expected)
                    error.args = (f"{self.path}: {error}",)
                    raise error
            return events

        return await self._on_reader(read)

    async def _last_seq(self, session_id: str) -> int:
        return await self._on_reader(
            lambda connection: _last_seq(connection, self.path, session_id)
        )

    async def _sessions(self) -> list[str]:
        def sessions(connection: sqlite3.Connection) -> list[str]:
            ids = [row[0] for row in connection.execute(_SESSIONS)]
            for session_id in ids:
                if not isinstance(session_id, str):
                    raise LogCorrupt(f"{self.path}: session id {session_id!r} is not text")
            return ids

        return await self._on_reader(sessions)

    async def _read_all(self, after: int, limit: int | None) -> list[tuple[int, Envelope]]:
        def read_all(connection: sqlite3.Connection) -> list[tuple[int, Envelope]]:
            rows = connection.execute(_READ_ALL, (after, _sql_limit(limit))).fetchall()
            return [(pos, _decode_row(self.path, *rest)) for pos, *rest in rows]

        return await self._on_reader(read_all)

    async def _on_reader(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `work` on the read connection in a worker thread, one at a time."""

        def guarded() -> _T:
            try:
                return work(self._reader)
            except sqlite3.Error as exc:
                raise _error(self.path, exc) from None

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
            raise _error(path, exc) from None
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
    """Create the tables in a new file; refuse a file with another schema."""
    if _user_version(connection) == _SCHEMA_VERSION:
        return
    connection.execute("BEGIN IMMEDIATE")
    try:
        _create_schema(connection, path)
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def _create_schema(connection: sqlite3.Connection, path: Path) -> None:
    """Inside a write transaction: create the tables unless another process just did."""
    version = _user_version(connection)
    if version == _SCHEMA_VERSION:
        return
    if version != 0:
        raise LogError(f"{path}: schema version {version} is not turnkeeper's ({_SCHEMA_VERSION})")
    for statement in _SCHEMA:
        connection.execute(statement)


def _user_version(connection: sqlite3.Connection) -> int:
    (version,) = connection.execute("PRAGMA user_version").fetchone()
    return int(version)


def _last_seq(connection: sqlite3.Connection, path: Path, session_id: str) -> int:
    (seq,) = connection.execute(_LAST_SEQ, (session_id,)).fetchone()
    if seq is None:
        return 0
    if not isinstance(seq, int):
        raise LogCorrupt(f"{path}: session {session_id}: seq {seq!r} is not an integer")
    return seq


def _decode_row(path: Path, session_id: Any, seq: Any, body: Any) -> Envelope:
    """The envelope stored in a row; LogCorrupt unless it decodes and matches its columns."""
    try:
        envelope = decode_envelope(body)
    except LogCorrupt as exc:
        raise LogCorrupt(f"{path}: session {session_id} seq {seq}: {exc}") from None
    if envelope.session_id != session_id or envelope.seq != seq:
        raise LogCorrupt(
            f"{path}: session {session_id} seq {seq}: body holds session "
            f"{envelope.session_id} seq {envelope.seq} instead"
        )
    return envelope


def _sql_limit(limit: int | None) -> int:
    # SQLite reads a negative LIMIT as no limit.
    return -1 if limit is None else limit


def _error(path: Path, exc: sqlite3.Error) -> LogError:
    """A turnkeeper error for a SQLite failure: LogCorrupt when the file is not a sound database."""
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
        return LogCorrupt(f"{path}: not a readable SQLite event log: {exc}")
    return LogError(f"{path}: {exc}")
