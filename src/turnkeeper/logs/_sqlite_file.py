"""A SqliteLog's file: its schema, its writer lock, whether SQLite writes it, and what
SQLite's own checks (`quick_check` on opening, `integrity_check` for `turnkeeper check`)
find wrong with it."""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
from pathlib import Path

import msgspec

from turnkeeper.core import LogError
from turnkeeper.logs._sqlite_checkpointer import WRITER_CHECKPOINT_PAGES
from turnkeeper.logs._sqlite_writer import sqlite_error, transaction

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
# Asks SQLite whether it writes the file (Python 3.11's sqlite3 has no
# sqlite3_db_readonly): a write that changes nothing, refused with SQLITE_READONLY when
# SQLite opened the file read-only (its mode, or a read-only directory).
_WRITE_PROBE = "DELETE FROM sessions WHERE 0"
# Fails ("no such table: ...") unless both tables are there: a file missing one opens as
# an error, not as a log whose every read of events fails.
_TABLES_PROBE = "SELECT 1 FROM sessions, events LIMIT 0"
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


class StoredChain(msgspec.Struct, frozen=True):
    """A session's rows as the events table holds them: how many, and the first break in
    their seq chain (None if they run 1, 2, 3...)."""

    rows: int = 0
    problem: str | None = None


class Storage(msgspec.Struct):
    """What opening a SqliteLog's file gives: the writer's connection and the writer lock's
    descriptor (None for a log that only reads, and then why it does), and the reader's
    connection."""

    writer: sqlite3.Connection | None
    lock_fd: int | None
    reader: sqlite3.Connection
    read_only_because: str = ""
    # What quick_check found wrong with the file; nothing if it is sound.
    damage: list[str] = msgspec.field(default_factory=list)


def open_storage(path: Path, read_only: bool) -> Storage:
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
    return Storage(None, None, storage.reader, because, damage)


def _opened(path: Path, read_only: bool) -> Storage:
    """Open the file for a log: read-only if `read_only`, else as its writer if the writer
    lock can be taken and SQLite writes the file, else for reading only (after making the
    schema, if the file is new, so that the reader finds it even if the lock's holder has
    not made it yet)."""
    if read_only:
        return Storage(None, None, _read_only_connection(path), "it was opened read_only")
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
        return Storage(None, None, _read_only_connection(path), f"SQLite opens it {exc}")
    except BaseException:
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    if lock_fd is None:
        writer.close()
        return Storage(None, None, reader, because)
    return Storage(writer, lock_fd, reader)


class _ReadOnlyFile(Exception):
    """SQLite opened the file read-only; the message says how it knows."""


def _release(storage: Storage) -> None:
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


def integrity_check(connection: sqlite3.Connection) -> list[str]:
    """What SQLite's integrity_check finds wrong with the file (nothing: an empty list)."""
    found = [_one_line(str(row[0])) for row in connection.execute(_INTEGRITY_CHECK)]
    return [] if found == ["ok"] else found


def stored_chains(connection: sqlite3.Connection) -> dict[str, StoredChain]:
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
    try:
        connection.execute(_TABLES_PROBE)
    except sqlite3.Error as exc:
        connection.close()
        raise sqlite_error(path, exc) from None
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
            connections.append(configured_connection(path))
        _ensure_schema(connections[0], path)
        connections[0].execute(_WRITE_PROBE)
        connections[0].execute(_TABLES_PROBE)
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


def configured_connection(path: Path) -> sqlite3.Connection:
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
