"""An event log in one SQLite file (WAL mode): the embedded default."""

from __future__ import annotations

import gc
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio

from turnkeeper.events._errors import LogCorrupt, LogError, SeqError
from turnkeeper.events._events import Envelope
from turnkeeper.events._jsonl import decode_envelope, decode_envelopes
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
# Events go in up to 64 rows per statement: a statement per row costs nearly twice as much
# (and each one lets go of the GIL). Sizes are powers of two, so a few statements serve.
_INSERT_SIZES = (64, 32, 16, 8, 4, 2, 1)
_INSERT_EVENTS = {
    size: "INSERT INTO events (session_id, seq, at, type, body) VALUES "
    + ", ".join(["(?, ?, ?, ?, ?)"] * size)
    for size in _INSERT_SIZES
}
_READ = (
    "SELECT session_id, seq, body FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)
_READ_ALL = "SELECT pos, session_id, seq, body FROM events WHERE pos > ? ORDER BY pos LIMIT ?"
_SESSIONS = "SELECT session_id FROM sessions ORDER BY id"
_BUSY_TIMEOUT_MS = 5000
# Rows per read: large enough that the worker-thread hop is cheap next to decoding the
# page, small enough that decoding one (on the event loop) stays within milliseconds.
_PAGE = 4096
# Sessions whose last seq the writer remembers; past this it starts again from empty.
_KNOWN_SESSIONS = 100_000


class _Pending:
    """An append waiting for its round's transaction, and its outcome once settled."""

    __slots__ = ("batch", "done", "error")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.done = False
        self.error: LogError | None = None


class _Round:
    """Appends committed together in one transaction; `settled` is set once each has its outcome."""

    __slots__ = ("pendings", "settled")

    def __init__(self, first: _Pending) -> None:
        self.pendings = [first]
        self.settled = anyio.Event()


class SqliteLog(EventLog):
    """An event log in the SQLite file at `path` (created if missing), in WAL mode.

    Group commit: appends that arrive while a transaction is being committed gather in
    the next round, and the next transaction commits all of them at once, so many
    sessions share one fsync. The first append of a round leads it: it waits for the
    round before, then commits its round's appends in a worker thread while the others
    wait for the round to settle, each woken once. Each append's expected seq is checked
    inside the transaction; a conflict fails only that append. `commits` counts the
    transactions committed.

    The writer remembers each session's last seq after its own commits, so a round needs
    no query per append. The memory is trusted only while `PRAGMA data_version` says no
    other connection (another process, say) has committed to the file since.

    Durability: `synchronous=FULL` fsyncs the WAL on every commit, so an append that
    has returned survives power loss, not only a crash of the process (with NORMAL,
    WAL commits since the last checkpoint can be lost); group commit pays for it.

    All database work runs in worker threads: writes on one connection, reads on a
    second, so reads never see a transaction in progress. Reads fetch pages of raw rows
    there and decode them on the calling thread, a page in one pass. Other processes may
    read the file while this one writes. Positions are the events' row ids, increasing in
    commit order and never reused.
    """

    _writer: sqlite3.Connection
    _reader: sqlite3.Connection
    _write_limiter: anyio.CapacityLimiter
    _read_limiter: anyio.CapacityLimiter

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self.commits = 0
        # The round taking appends (its leader has not started the commit yet), if any.
        self._open_round: _Round | None = None
        # The round whose transaction is in progress, if any.
        self._committing: _Round | None = None
        # Written and read only by _commit, in the writer's thread.
        self._last_seqs: dict[str, int] = {}
        self._data_version: int | None = None

    def __repr__(self) -> str:
        return f"SqliteLog({str(self.path)!r})"

    async def _open(self) -> None:
        self._write_limiter = anyio.CapacityLimiter(1)
        self._read_limiter = anyio.CapacityLimiter(1)
        self._writer, self._reader = await anyio.to_thread.run_sync(_connect, self.path)

    async def _close(self) -> None:
        while (round_ := self._open_round or self._committing) is not None:
            await round_.settled.wait()
        await anyio.to_thread.run_sync(self._reader.close, limiter=self._read_limiter)
        await anyio.to_thread.run_sync(self._writer.close, limiter=self._write_limiter)

    async def _append(self, batch: Batch) -> None:
        pending = _Pending(batch)
        round_ = self._open_round
        if round_ is None:
            round_ = self._open_round = _Round(pending)
            await self._lead(round_)
        else:
            round_.pendings.append(pending)
            try:
                await round_.settled.wait()
            except BaseException:
                # Cancelled before its round was taken: it is not written.
                if round_ is self._open_round:
                    round_.pendings.remove(pending)
                raise
        if not pending.done:
            raise LogError(f"{self.path}: append failed unexpectedly")
        if pending.error is not None:
            raise pending.error

    async def _lead(self, round_: _Round) -> None:
        """Commit `round_` after the round before it, and settle each of its appends."""
        # Shielded: the round's other appenders wait on its leader, so it finishes even if
        # cancelled (waiting at most for one round before it).
        with anyio.CancelScope(shield=True):
            try:
                previous = self._committing
                if previous is not None:
                    await previous.settled.wait()
                # Appenders that are ready to run (woken by the round before, say) join this one.
                await anyio.lowlevel.checkpoint()
                self._open_round = None
                self._committing = round_
                pendings = round_.pendings
                outcomes = await anyio.to_thread.run_sync(
                    self._commit,
                    [pending.batch for pending in pendings],
                    limiter=self._write_limiter,
                )
                for pending, outcome in zip(pendings, outcomes, strict=True):
                    pending.done = True
                    pending.error = outcome
            finally:
                if self._open_round is round_:
                    self._open_round = None
                if self._committing is round_:
                    self._committing = None
                round_.settled.set()

    def _commit(self, batches: list[Batch]) -> list[LogError | None]:
        """In a worker thread: write every batch whose expected seq holds, in one transaction."""
        connection = self._writer
        known = self._last_seqs
        outcomes: list[LogError | None] = []
        written: dict[str, int] = {}
        new_sessions: list[tuple[str]] = []
        # Each event's five column values, one after another.
        values: list[str | int | float | bytes] = []
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                (version,) = connection.execute("PRAGMA data_version").fetchone()
                if version != self._data_version:
                    # Another connection has committed since this one last looked.
                    known.clear()
                    self._data_version = version
                for batch in batches:
                    session_id = batch.session_id
                    actual = written.get(session_id)
                    if actual is None:
                        actual = known.get(session_id)
                        if actual is None:
                            actual = _last_seq(connection, self.path, session_id)
                    if actual != batch.expected_seq:
                        outcomes.append(SeqConflict(session_id, batch.expected_seq, actual))
                        continue
                    if actual == 0:
                        new_sessions.append((session_id,))
                    for envelope, line in zip(batch.events, batch.lines, strict=True):
                        values += (session_id, envelope.seq, envelope.at, envelope.type, line)
                    written[session_id] = batch.events[-1].seq
                    outcomes.append(None)
                connection.executemany(_INSERT_SESSION, new_sessions)
                _insert_events(connection, values)
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self._forget_last_seqs()
            return [_error(self.path, exc) for _ in batches]
        except LogCorrupt as exc:
            self._forget_last_seqs()
            return [LogCorrupt(str(exc)) for _ in batches]
        if values:
            self.commits += 1
            if len(known) > _KNOWN_SESSIONS:
                known.clear()
            known.update(written)
        return outcomes

    def _forget_last_seqs(self) -> None:
        """After a failed transaction, learn each session's last seq from the file again."""
        self._last_seqs.clear()
        self._data_version = None

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        events: list[Envelope] = []
        while True:
            size = _PAGE if limit is None else min(limit - len(events), _PAGE)
            parameters = (session_id, after + len(events), size)
            rows = await self._on_reader(partial(_fetch, _READ, parameters))
            with _gc_paused():
                page = _decode_page(self.path, rows)
            expected = after + len(events) + 1
            for (_, seq, _), envelope in zip(rows, page, strict=True):
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
        # Page after page by position: each commit's rows follow every earlier commit's, so
        # the pages join into what one read at the end would have returned (with a limit).
        found: list[tuple[int, Envelope]] = []
        while True:
            size = _PAGE if limit is None else min(limit - len(found), _PAGE)
            rows = await self._on_reader(partial(_fetch, _READ_ALL, (after, size)))
            with _gc_paused():
                page = _decode_page(self.path, rows)
                for (position, session_id, seq, _), envelope in zip(rows, page, strict=True):
                    if envelope.session_id != session_id or envelope.seq != seq:
                        raise _mismatch(self.path, session_id, seq, envelope)
                    found.append((position, envelope))
            if len(rows) < size or len(found) == limit:
                return found
            after = found[-1][0]

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


def _insert_events(connection: sqlite3.Connection, values: list[str | int | float | bytes]) -> None:
    """Insert events from their column values, five per event, with few statements."""
    start = 0
    for size in _INSERT_SIZES:
        width = 5 * size
        while len(values) - start >= width:
            connection.execute(_INSERT_EVENTS[size], values[start : start + width])
            start += width


def _fetch(query: str, parameters: tuple[object, ...], connection: sqlite3.Connection) -> list[Any]:
    """In a worker thread: a page of rows, the body last."""
    with _gc_paused():
        return connection.execute(query, parameters).fetchall()


def _decode_page(path: Path, rows: list[Any]) -> list[Envelope]:
    """The envelopes in a page of rows (the body last, after its session id and seq).

    All the bodies decode in one pass unless one of them is bad; then each row decodes
    alone, so the error names the first bad one. The caller checks the columns.
    """
    try:
        return decode_envelopes([row[-1] for row in rows])
    except LogCorrupt:
        return [_decode_row(path, *row[-3:]) for row in rows]


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


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Hold off the cycle collector while a page of rows is fetched or decoded.

    Each row and event makes a few containers the collector tracks, so a page of them
    would set off several collections, each walking every tracked object in the process
    (Mercurial's `nogc` does the same for bulk loads). Nothing made here forms a cycle;
    the collector sees the objects once it runs again. The switch is process-wide: code
    that turns the collector off while a page is being read finds it back on after.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _error(path: Path, exc: sqlite3.Error) -> LogError:
    """A turnkeeper error for a SQLite failure: LogCorrupt when the file is not a sound database."""
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
        return LogCorrupt(f"{path}: not a readable SQLite event log: {exc}")
    return LogError(f"{path}: {exc}")
