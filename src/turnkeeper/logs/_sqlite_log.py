"""An event log in one SQLite file (WAL mode): the embedded default."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec
import structlog

from turnkeeper.core import LogCorrupt, LogError, SeqError, gc_paused
from turnkeeper.events import Envelope, decode_envelope, decode_envelopes
from turnkeeper.logs._log import Batch, EventLog
from turnkeeper.logs._sqlite_checkpointer import WRITER_CHECKPOINT_PAGES, Checkpointer
from turnkeeper.logs._sqlite_writer import Writer, last_seq, sqlite_error, transaction

_T = TypeVar("_T")

_logger = structlog.get_logger(__name__)

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
# A read's rows: a session's after a seq, in seq order, or all sessions' after a position.
_SESSION_ROWS = """SELECT pos, session_id, seq, body FROM events
    WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"""
_ALL_ROWS = "SELECT pos, session_id, seq, body FROM events WHERE pos > ? ORDER BY pos LIMIT ?"
_SESSIONS = "SELECT session_id FROM sessions ORDER BY id"
# What the file records of a session apart from its rows in seq order: its last row's
# seq and whether it is in the sessions table. A read of the session is checked against
# it, read before the rows: events are only ever added, so the rows read after it reach
# at least that far, and a read that stops short has met a damaged file.
_RECORDED = """SELECT (SELECT max(seq) FROM events WHERE session_id = ?1),
    EXISTS (SELECT 1 FROM sessions WHERE session_id = ?1)"""
# Asks SQLite whether it writes the file (Python 3.11's sqlite3 has no
# sqlite3_db_readonly): a write that changes nothing, refused with SQLITE_READONLY when
# SQLite opened the file read-only (its mode, or a read-only directory).
_WRITE_PROBE = "DELETE FROM sessions WHERE 0"
_INTEGRITY_CHECK = "PRAGMA integrity_check"
# Every row in position order, read from the table itself rather than through the index
# that reads use.
_STORED_ROWS = "SELECT session_id, seq FROM events NOT INDEXED ORDER BY pos"
# quick_check's first findings are enough to say the file is damaged; `turnkeeper check`
# lists them all.
_QUICK_CHECK = "PRAGMA quick_check(10)"
_BUSY_TIMEOUT_MS = 5000
# The writer lock's file, beside the database: `log.db` is locked by `log.db-writer.lock`.
_LOCK_SUFFIX = "-writer.lock"
# Rows per page: large enough that the worker-thread hop is cheap next to decoding the
# page, small enough that decoding one (on the event loop) stays within milliseconds.
_PAGE = 4096
_integers = msgspec.json.Decoder(list[int])
_texts = msgspec.json.Decoder(list[str])
_session_of = attrgetter("session_id")
_seq_of = attrgetter("seq")


def _aggregated(rows: str) -> str:
    """A query for the rows of `rows` as one row: their positions, session ids and seqs as
    JSON arrays, and their bodies joined by newlines (which this package's bodies, compact
    JSON, never hold).

    Fetched one by one, rows take and drop the GIL at every row and hold it to build each
    row's tuple; as one row, SQLite makes a whole page in one step, without the GIL.
    """
    return f"""SELECT json_group_array(pos), json_group_array(session_id),
        json_group_array(seq), CAST(group_concat(body, x'0a') AS BLOB)
        FROM ({rows})"""


class _Query(msgspec.Struct, frozen=True):
    """A read's rows, queried row by row and as one row of aggregates; `by_seq` if they
    come in seq order (else in position order)."""

    rows: str
    aggregated: str
    by_seq: bool


_SESSION = _Query(_SESSION_ROWS, _aggregated(_SESSION_ROWS), by_seq=True)
_ALL = _Query(_ALL_ROWS, _aggregated(_ALL_ROWS), by_seq=False)


class _Page(msgspec.Struct, frozen=True):
    """Rows of the events table, by column; a body is cut from the page's joined bodies,
    or the stored value when the page was fetched row by row."""

    positions: list[int]
    session_ids: list[Any]
    seqs: list[Any]
    bodies: list[Any]

    def last(self, query: _Query) -> Any:
        """What the next page of `query` comes after: the last row's seq or position."""
        return self.seqs[-1] if query.by_seq else self.positions[-1]


class StoredChain(msgspec.Struct, frozen=True):
    """A session's rows as the events table holds them: how many, and the first break in
    their seq chain (None if they run 1, 2, 3...)."""

    rows: int = 0
    problem: str | None = None


class _Storage(msgspec.Struct):
    """What opening a SqliteLog's file gives: the writer's connection and the writer lock's
    descriptor (None for a log that only reads, and then why it does), and the reader's
    connection."""

    writer: sqlite3.Connection | None
    lock_fd: int | None
    reader: sqlite3.Connection
    read_only_because: str = ""
    # What quick_check found wrong with the file; nothing if it is sound.
    damage: list[str] = msgspec.field(default_factory=list)


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

    Checkpoints (copying the WAL into the database file) run in a thread of their own,
    beside the writer's commits rather than inside them (see `Checkpointer`).

    All database work runs in threads: writes on one connection in the writer's, reads
    on a second in worker threads, so reads never see a transaction in progress, and
    checkpoints on a third in the checkpointer's, opened at the first. Reads
    fetch pages of rows there, each as one row of aggregates, and decode them on the
    calling thread while the next page is fetched. Other processes may read the file
    while this one writes. Positions are the events' row ids, increasing in commit order
    and never reused.

    One log writes a file at a time: opening one takes a lock on the file `path` +
    `-writer.lock` beside it, held until `close`, and a log opened while another (in this
    process or another) holds it only reads: its appends raise LogError, and `writable` is
    False. So two Hosts on one file cannot both write its sessions. A log opened
    `read_only` never takes the lock and never writes the database (it opens it
    read-only, and the file must exist), so a reader (a tailer, the command line) cannot
    keep a writer that starts at the same moment from writing. A file SQLite can only
    read (its mode, a read-only directory) opens for reading too.

    Damage is looked for, not assumed away: opening runs SQLite's `quick_check`, and a
    file it finds damaged opens for reading only (writing a damaged file can spread the
    damage), saying so in `read_only_because` and in an error logged once. A read of a
    session that stops short of the session's last row, or finds no rows of a session
    the sessions table lists, raises LogCorrupt naming the session, as a gap or a bad row
    does. `integrity_check` and `stored_chains` (for `turnkeeper check`) look further.
    """

    # The writer exists only in a log that writes (`_writing`).
    _writer: Writer
    _reader: sqlite3.Connection
    _read_limiter: anyio.CapacityLimiter

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        super().__init__()
        self.path = Path(path)
        self.read_only = read_only
        self._writing = False
        self._lock_fd: int | None = None
        self._read_only_because = ""

    @property
    def commits(self) -> int:
        """Transactions committed so far."""
        return self._writer.commits if self._writing else 0

    @property
    def read_only_because(self) -> str:
        """Why the open log does not write its file ("" while it does, and before it opens):
        it was opened `read_only`, another log writes it, SQLite opens it read-only, or
        `quick_check` found it damaged."""
        return self._read_only_because

    def __repr__(self) -> str:
        suffix = ", read_only=True" if self.read_only else ""
        return f"SqliteLog({str(self.path)!r}{suffix})"

    async def _open(self) -> None:
        self._read_limiter = anyio.CapacityLimiter(1)
        # One call in a thread, and nothing awaited after it: a cancelled open either
        # fails in the thread (which lets go of what it took) or opens the log whole,
        # for `close` to release.
        storage = await anyio.to_thread.run_sync(_open_storage, self.path, self.read_only)
        self._reader = storage.reader
        self._lock_fd = storage.lock_fd
        self._read_only_because = storage.read_only_because
        if storage.damage:
            _logger.error("sqlite log: damaged file", path=str(self.path), damage=storage.damage)
        if storage.writer is not None:
            try:
                checkpointer = Checkpointer(partial(_connection, self.path), self.path)
                self._writer = Writer(storage.writer, self.path, checkpointer)
                self._writing = True
            except BaseException:
                storage.writer.close()
                storage.reader.close()
                self._unlock()
                raise

    async def _close(self) -> None:
        try:
            if self._writing:
                await self._writer.close()
            await anyio.to_thread.run_sync(self._reader.close, limiter=self._read_limiter)
        finally:
            # Once the writer's connection is closed: the next writer starts after this one.
            self._unlock()

    def _writes(self) -> bool:
        return self._writing

    def _unlock(self) -> None:
        """Release the writer lock if this log holds it."""
        if self._lock_fd is not None:
            # Released, not only closed: a child forked meanwhile shares the descriptor,
            # and would hold the lock until it exits.
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _append(self, batch: Batch) -> None:
        if not self._writing:
            raise LogError(f"{self.path}: this log only reads the file: {self._read_only_because}")
        await self._writer.append(batch)

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        events: list[Envelope] = []
        recorded: list[tuple[Any, Any]] = []

        def record(connection: sqlite3.Connection) -> None:
            recorded.append(connection.execute(_RECORDED, (session_id,)).fetchone())

        def take(page: _Page) -> None:
            envelopes = _decoded(self.path, page)
            expected = after + len(events) + 1
            if page.seqs != list(range(expected, expected + len(page.seqs))):
                raise _gap(self.path, session_id, page.seqs, expected)
            events.extend(envelopes)

        # One pause of the cycle collector for the whole read (see `_read_all`).
        with gc_paused():
            await self._read_pages(_SESSION, (session_id,), after, limit, take, record)
        _check_recorded(self.path, session_id, after, limit, len(events), *recorded[0])
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

        def take(page: _Page) -> None:
            found.extend(zip(page.positions, _decoded(self.path, page), strict=True))

        # One pause of the cycle collector for the whole read: paused page by page, it
        # would walk each page once the page is decoded, and again in the older
        # generations' collections that the many young ones set off.
        with gc_paused():
            await self._read_pages(_ALL, (), after, limit, take)
        return found

    async def _read_pages(
        self,
        query: _Query,
        key: tuple[object, ...],
        after: int,
        limit: int | None,
        take: Callable[[_Page], None],
        before: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """Hand `take` the pages of `query`'s rows after `after`, at most `limit` rows in
        all, in order, having run `before` on the connection in the same worker thread
        call as the first page's fetch. After the first page, one call in a worker thread
        fetches the rest one after another: while `take` has one page, it fetches the
        next, in SQLite without the GIL, so the two overlap. An error is raised as itself:
        the one `take` raised, else the fetch's."""
        size = _page_size(limit, 0)
        page = await self._on_reader(partial(_fetch_first, before, query, (*key, after, size)))
        if not _read_on(page, size, size, limit):
            take(page)
            return
        pages = _Pages()
        errors: list[Exception] = []
        rest = partial(_fetch_pages, query, key, page.last(query), limit, size, pages)

        async def fetch() -> None:
            try:
                await self._on_reader(rest)
            except Exception as exc:
                errors.append(exc)
            finally:
                pages.send.close()
                pages.going.set()
                pages.begun.set()

        async with anyio.create_task_group() as group:
            group.start_soon(fetch)
            try:
                await pages.begun.wait()
                while True:
                    # The thread, once it has begun or been given a page, goes on into
                    # SQLite for the next and needs the GIL to get there; `take` would hold
                    # it for milliseconds (a thread that asks gets it only every
                    # `sys.getswitchinterval()`): it is let go for the microseconds that
                    # takes.
                    pages.going.wait()
                    pages.taken.set()
                    take(page)
                    try:
                        page = await pages.receive.receive()
                    except anyio.EndOfStream:
                        break
            except Exception as exc:
                errors.insert(0, exc)
            finally:
                pages.stop()
                pages.receive.close()
        if errors:
            raise errors[0]

    async def integrity_check(self) -> list[str]:
        """What SQLite's integrity_check finds wrong with the file (nothing: an empty
        list): it reads every page and checks every index against its table, which takes
        a while on a large file (for `turnkeeper check`, not for every open)."""
        await self._ready()

        def check(connection: sqlite3.Connection) -> list[str]:
            found = [_one_line(str(row[0])) for row in connection.execute(_INTEGRITY_CHECK)]
            return [] if found == ["ok"] else found

        return await self._on_reader(check)

    async def stored_chains(self) -> dict[str, StoredChain]:
        """Every session's rows as the events table holds them, read in position order
        from the table itself, not through the index reads use (for `turnkeeper check`,
        which holds them against what `read` returns). A session id that is not text is
        given as its repr."""
        await self._ready()
        return await self._on_reader(_stored_chains)

    async def _on_reader(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `work` on the read connection in a worker thread, one at a time."""

        def guarded() -> _T:
            try:
                return work(self._reader)
            except sqlite3.Error as exc:
                raise sqlite_error(self.path, exc) from None

        return await anyio.to_thread.run_sync(guarded, limiter=self._read_limiter)


def _open_storage(path: Path, read_only: bool) -> _Storage:
    """Open the file for a log (see `_opened`), then quick_check it: a file it finds
    damaged opens for reading only, saying why."""
    storage = _opened(path, read_only)
    try:
        damage = _quick_check(storage.reader, path)
    except BaseException:
        _release(storage)
        storage.reader.close()
        raise
    if not damage:
        return storage
    _release(storage)
    because = f"SQLite's quick_check finds it damaged ({damage[0]}); see: turnkeeper check {path}"
    return _Storage(None, None, storage.reader, because, damage)


def _opened(path: Path, read_only: bool) -> _Storage:
    """Open the file for a log: read-only if `read_only`, else as its writer if the writer
    lock can be taken and SQLite writes the file, else for reading only (after making the
    schema, if the file is new, so that the reader finds it even if the lock's holder has
    not made it yet)."""
    if read_only:
        return _Storage(None, None, _read_only_connection(path), "it was opened read_only")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LogError(f"{path}: cannot make its directory: {exc}") from None
    lock_fd, because = _lock(path)
    try:
        writer, reader = _connect(path)
    except _ReadOnlyFile as exc:
        if lock_fd is not None:
            os.close(lock_fd)
        return _Storage(None, None, _read_only_connection(path), f"SQLite opens it {exc}")
    except BaseException:
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    if lock_fd is None:
        writer.close()
        return _Storage(None, None, reader, because)
    return _Storage(writer, lock_fd, reader)


class _ReadOnlyFile(Exception):
    """SQLite opened the file read-only; the message says how it knows."""


def _release(storage: _Storage) -> None:
    """Close the writer's connection and release the writer lock, if the storage has them."""
    if storage.writer is not None:
        storage.writer.close()
    if storage.lock_fd is not None:
        os.close(storage.lock_fd)


def _quick_check(connection: sqlite3.Connection, path: Path) -> list[str]:
    """What SQLite's quick_check finds wrong with the file (nothing: an empty list).

    quick_check reads every page and checks each b-tree's structure and the NOT NULL
    columns, but not that the indexes agree with the tables (`integrity_check` does, for
    about half as much time again); reads check the index's answers against what else
    the file records of the session (see `_RECORDED`)."""
    try:
        rows = connection.execute(_QUICK_CHECK).fetchall()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "").startswith("SQLITE_CORRUPT"):
            return [str(exc)]
        raise sqlite_error(path, exc) from None
    found = [_one_line(str(message)) for (message,) in rows]
    return [] if found == ["ok"] else found


def _one_line(message: str) -> str:
    """A check's message on one line, without the name of the only database checked."""
    return " ".join(message.split()).removeprefix("*** in database main *** ")


def _lock(path: Path) -> tuple[int | None, str]:
    """Take the writer lock of the database at `path`: the lock's descriptor, or None and
    why it was not taken (another log holds it, or it cannot be taken here).

    The lock is a flock on a file of its own beside the database, not on the database:
    a descriptor of ours on the database would, once closed, drop every fcntl lock this
    process holds on it, SQLite's own included, and on NFS flock is emulated with fcntl
    locks, which would collide with SQLite's.
    """
    # Named from the file the path leads to: a symlink to the database is the same log.
    real = path.resolve()
    lock_path = real.with_name(real.name + _LOCK_SUFFIX)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        return None, f"cannot open its writer lock: {exc}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None, f"another log writes it (it holds the writer lock {lock_path})"
        return None, f"cannot take its writer lock {lock_path}: {exc}"
    return fd, ""


def _stored_chains(connection: sqlite3.Connection) -> dict[str, StoredChain]:
    """In a worker thread: each session's rows (see `SqliteLog.stored_chains`)."""
    rows: dict[str, int] = {}
    problems: dict[str, str] = {}
    for session_id, seq in connection.execute(_STORED_ROWS):
        key = session_id if isinstance(session_id, str) else repr(session_id)
        count = rows.get(key, 0)
        rows[key] = count + 1
        if key in problems:
            continue
        if not isinstance(session_id, str):
            problems[key] = f"session id {session_id!r} is not text"
        elif type(seq) is not int or seq != count + 1:
            problems[key] = f"seq {seq!r} where seq {count + 1} should be"
    return {key: StoredChain(count, problems.get(key)) for key, count in rows.items()}


def _read_only_connection(path: Path) -> sqlite3.Connection:
    """A connection that only reads the database (which must exist and be turnkeeper's)."""
    if not path.is_file():
        raise LogError(f"{path}: no log file there")
    try:
        connection, version = _read_only_open(path, "mode=ro")
    except sqlite3.OperationalError as exc:
        # A WAL file is read through its -shm file, which SQLite cannot make in a
        # read-only directory. Nobody can write the file there either (a writer needs a
        # -wal file beside it), so it is read as immutable: without the -shm file, which
        # only a -wal file holding commits needs.
        if exc.sqlite_errorname != "SQLITE_READONLY_DIRECTORY" or _has_commits_in_wal(path):
            raise sqlite_error(path, exc) from None
        try:
            connection, version = _read_only_open(path, "mode=ro&immutable=1")
        except sqlite3.Error as again:
            raise sqlite_error(path, again) from None
    except sqlite3.Error as exc:
        raise sqlite_error(path, exc) from None
    # A version 1 file reads as a version 2 one does (only its writer differs).
    if version not in (1, _SCHEMA_VERSION):
        connection.close()
        if version == 0:
            raise LogError(f"{path}: not a turnkeeper event log (it has no log schema)")
        raise LogError(f"{path}: schema version {version} is not turnkeeper's ({_SCHEMA_VERSION})")
    return connection


def _has_commits_in_wal(path: Path) -> bool:
    """Whether the file's -wal file holds anything (commits not yet checkpointed)."""
    try:
        return path.with_name(path.name + "-wal").stat().st_size > 0
    except FileNotFoundError:
        return False


def _read_only_open(path: Path, parameters: str) -> tuple[sqlite3.Connection, int]:
    """A connection opened with the URI `parameters` (as a URI, any name can be one), and
    the file's schema version, read through it."""
    uri = f"{path.absolute().as_uri()}?{parameters}"
    connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        return connection, _user_version(connection)
    except BaseException:
        connection.close()
        raise


def _connect(path: Path) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """Open the writer and reader connections, making the schema if the file is new;
    _ReadOnlyFile if SQLite only reads the file."""
    connections: list[sqlite3.Connection] = []
    try:
        for _ in range(2):
            connections.append(_connection(path))
        _ensure_schema(connections[0], path)
        connections[0].execute(_WRITE_PROBE)
        # Checkpoints are the checkpointer's; the writer's own is a backstop.
        connections[0].execute(f"PRAGMA wal_autocheckpoint = {WRITER_CHECKPOINT_PAGES}")
    except BaseException as exc:
        for connection in connections:
            connection.close()
        if isinstance(exc, sqlite3.Error):
            if getattr(exc, "sqlite_errorname", "").startswith("SQLITE_READONLY"):
                raise _ReadOnlyFile(f"read-only ({exc})") from None
            raise sqlite_error(path, exc) from None
        raise
    return connections[0], connections[1]


def _connection(path: Path) -> sqlite3.Connection:
    """A connection to the file, configured (see `_configure`)."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        _configure(connection, path)
    except BaseException:
        connection.close()
        raise
    return connection


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


def _page_size(limit: int | None, fetched: int) -> int:
    """Rows to fetch in the next page, `fetched` rows into a read of at most `limit`."""
    return _PAGE if limit is None else min(limit - fetched, _PAGE)


def _read_on(page: _Page, size: int, fetched: int, limit: int | None) -> bool:
    """Whether a read goes on after `page`, fetched as `size` rows: it came full, and the
    `fetched` rows so far are not yet `limit`."""
    return len(page.positions) == size and fetched != limit


def _fetch_first(
    before: Callable[[sqlite3.Connection], None] | None,
    query: _Query,
    parameters: tuple[object, ...],
    connection: sqlite3.Connection,
) -> _Page:
    """In a worker thread: run `before`, then fetch the first page."""
    if before is not None:
        before(connection)
    return _fetch_page(query, parameters, connection)


def _fetch_page(
    query: _Query, parameters: tuple[object, ...], connection: sqlite3.Connection
) -> _Page:
    """In a worker thread: a page of `query`'s rows, fetched as one row of aggregates, or
    row by row if a value in it is not of its column's type, a body holds a newline (in
    a file changed by hand) or the page's bodies joined are longer than SQLite's longest
    value (a gigabyte by default; each body alone is shorter)."""
    try:
        aggregates = connection.execute(query.aggregated, parameters).fetchone()
    except (sqlite3.OperationalError, sqlite3.DataError) as exc:
        # SQLITE_ERROR: what a blob as a session id or seq makes JSON aggregates raise.
        if exc.sqlite_errorname not in ("SQLITE_ERROR", "SQLITE_TOOBIG"):
            raise
        aggregates = None
    page = None if aggregates is None else _unpacked(query, *aggregates)
    if page is None:
        rows = connection.execute(query.rows, parameters).fetchall()
        page = _Page(*map(list, zip(*rows, strict=True))) if rows else _Page([], [], [], [])
    return page


class _Pages:
    """Pages handed from the worker thread that fetches them to the task that takes them,
    one at a time: the thread fetches the next page while the task has one."""

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[_Page](1)
        self.begun = anyio.Event()
        # Set once the task has the page handed over before (or the first, fetched before
        # the thread began) and is past waiting for `going`: only then may `going` be
        # cleared for the next page.
        self.taken = threading.Event()
        # Set once the thread, begun or given the task's page, is going on into SQLite
        # (or is done).
        self.going = threading.Event()
        self.stopped = False

    def begin(self) -> None:
        """In the worker thread: tell the task it has begun."""
        anyio.from_thread.run_sync(self.begun.set)

    def hand_over(self, page: _Page) -> bool:
        """In the worker thread: give `page` to the task once it has taken the one before;
        False if it stopped taking pages."""
        self.taken.wait()
        if self.stopped:
            return False
        self.taken.clear()
        self.going.clear()
        anyio.from_thread.run_sync(self.send.send_nowait, page)
        return True

    def stop(self) -> None:
        """The task takes no more pages."""
        self.stopped = True
        self.taken.set()


def _fetch_pages(
    query: _Query,
    key: tuple[object, ...],
    after: int,
    limit: int | None,
    fetched: int,
    pages: _Pages,
    connection: sqlite3.Connection,
) -> None:
    """In a worker thread: fetch `query`'s rows after `after`, page by page, and hand each
    to `pages`, until there are no more or `limit` rows have been fetched in all, counting
    the `fetched` already."""
    try:
        pages.begin()
        while True:
            size = _page_size(limit, fetched)
            pages.going.set()
            page = _fetch_page(query, (*key, after, size), connection)
            fetched += size
            more = _read_on(page, size, fetched, limit)
            if not pages.hand_over(page) or not more:
                return
            after = page.last(query)
    finally:
        # However it ends, the task must not wait for it to go on.
        pages.going.set()


def _unpacked(
    query: _Query, positions: str, session_ids: str, seqs: str, bodies: bytes | None
) -> _Page | None:
    """The page in a row of aggregates, or None if it cannot stand for the rows.

    A null or a value of another type where the schema has a session id or seq does not
    decode. The joined bodies split into one part per row unless a body is null or holds
    a newline. SQLite aggregates rows in its subquery's order, but does not promise to.
    """
    try:
        page = _Page(
            _integers.decode(positions), _texts.decode(session_ids), _integers.decode(seqs), []
        )
    except msgspec.DecodeError:
        return None
    if bodies is not None:
        # Lines (each but the last keeps its newline, which decodes as white space): a
        # BytesIO finds them with memchr, three times as fast as bytes.split's byte loop.
        page.bodies.extend(io.BytesIO(bodies).readlines())
    order = page.seqs if query.by_seq else page.positions
    if not (
        len(page.session_ids) == len(page.seqs) == len(page.bodies) == len(page.positions)
        and order == sorted(order)
    ):
        return None
    return page


def _decoded(path: Path, page: _Page) -> list[Envelope]:
    """The envelopes in a page, each body decoded alone; LogCorrupt naming the first row
    whose body is not an envelope, or not of the row's session id and seq."""
    try:
        envelopes = decode_envelopes(page.bodies)
    except LogCorrupt:
        rows = zip(page.session_ids, page.seqs, page.bodies, strict=True)
        envelopes = [_decode_row(path, *row) for row in rows]
    # Compared a column at a time; a page that differs is walked to name its row.
    if (
        list(map(_session_of, envelopes)) != page.session_ids
        or list(map(_seq_of, envelopes)) != page.seqs
    ):
        raise _first_mismatch(path, page, envelopes)
    return envelopes


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


def _first_mismatch(path: Path, page: _Page, envelopes: list[Envelope]) -> LogCorrupt:
    """The error naming the first row of `page` whose envelope is not of its session id
    and seq."""
    for session_id, seq, envelope in zip(page.session_ids, page.seqs, envelopes, strict=True):
        if envelope.session_id != session_id or envelope.seq != seq:
            return _mismatch(path, session_id, seq, envelope)
    raise AssertionError("every envelope matches its row")


def _check_recorded(
    path: Path,
    session_id: str,
    after: int,
    limit: int | None,
    read: int,
    last: Any,
    listed: Any,
) -> None:
    """Raise LogCorrupt unless a read of `read` events after seq `after` (of at most
    `limit`) agrees with what the file recorded of the session before it: its last row's
    seq `last` (None: it has no rows) and whether the sessions table lists it."""
    if last is None:
        if listed and after == 0:
            raise LogCorrupt(
                f"{path}: session {session_id} is in the sessions table but has no events "
                f"(a damaged file? see: turnkeeper check {path})"
            )
        return
    if not isinstance(last, int):
        raise LogCorrupt(f"{path}: session {session_id}: seq {last!r} is not an integer")
    wanted = max(last - after, 0) if limit is None else min(max(last - after, 0), limit)
    if read < wanted:
        raise LogCorrupt(
            f"{path}: session {session_id}: the read stops at seq {after + read}, but its "
            f"last event is seq {last} (a damaged file? see: turnkeeper check {path})"
        )


def _gap(path: Path, session_id: str, seqs: list[Any], expected: int) -> SeqError:
    """The error naming the first of `seqs` (a session's, in order) that is not the
    session's next, `expected` being the first's."""
    for seq in seqs:
        if seq != expected:
            error = SeqError(session_id, seq, expected)
            error.args = (f"{path}: {error}",)
            return error
        expected += 1
    raise AssertionError("every seq follows the one before")
