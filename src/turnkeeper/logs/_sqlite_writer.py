"""The SQLite log's writer: a thread that commits appends in rounds, one after another."""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio

from turnkeeper.core import LogCorrupt, LogError
from turnkeeper.logs._log import Batch, SeqConflict
from turnkeeper.logs._sqlite_checkpointer import Checkpointer

_LAST_SEQ = "SELECT max(seq) FROM events WHERE session_id = ?"
_WRITTEN = "SELECT session_id, seq FROM events WHERE pos > ? AND pos <= ?"
# One statement writes a round's appends: each row carries its session id, seq, time,
# type and body, the seq its append expects the session to be at, and its place. A row
# is kept only if that expected seq is the session's last seq in the file: SQLite checks
# every row before it inserts any (it sorts them first), so an append's rows are kept or
# dropped together. A statement outside a transaction is one: it begins, inserts and
# commits in one call to SQLite, without the GIL. That is the point: the event loop's
# thread, busy running sessions, hands the GIL back only every few milliseconds, and
# each call that lets go of it (a BEGIN, a check, a COMMIT) delayed the commit by as
# much. (The sessions table fills itself, by a trigger.)
_COLUMNS = 7
_INSERT = (
    "INSERT INTO events (session_id, seq, at, type, body) "
    "SELECT column1, column2, column3, column4, column5 FROM (VALUES {rows}) "
    "WHERE coalesce((SELECT max(seq) FROM events WHERE session_id = column1), 0) = column6 "
    "ORDER BY column7"
)
# Statements hold 8, 16, 32... rows, the rest padding that no check keeps, so a few
# prepared statements serve every round.
_SMALLEST = 8
_MOST_ROWS = 4096
_PADDING: tuple[str | int | float | bytes, ...] = ("", 0, 0.0, "", b"", -1)


class Pending:
    """An append on its way to the file: its batch, and its outcome once its round settles."""

    __slots__ = ("batch", "error")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.error: LogError | None = None


class Round:
    """Appends committed in one transaction; their tasks wait on `done`, set on the event
    loop once every append has its outcome."""

    __slots__ = ("done", "pendings", "settled", "taken")

    def __init__(self) -> None:
        self.pendings: list[Pending] = []
        # Set by the writer thread, under its lock, when it takes the round.
        self.taken = False
        self.settled = False
        self.done = anyio.Event()


class Writer:
    """Commits appends on `connection` in a thread of its own.

    Appends gather in a round while the round before commits; as soon as it has, the
    thread takes the gathered round, with no trip through the event loop in between, so
    an append waits for at most the round before its own. Once a round is committed, the
    thread hands it to the event loop (`_settle`, a callback run there, not a task), which
    wakes the round's tasks once.

    A round is one statement, its own transaction (see `_INSERT`), unless it is too large
    for one or holds two appends of a session: then a statement per group of appends. Each
    append's expected seq is checked by the statement that writes it, against the file,
    so a conflict with another writer, even in another process, fails only that append.
    """

    def __init__(
        self, connection: sqlite3.Connection, path: Path, checkpointer: Checkpointer
    ) -> None:
        self.path = path
        self.commits = 0
        self._connection = connection
        self._checkpointer = checkpointer
        self._token = anyio.lowlevel.current_token()
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        # Shared with the thread, under the lock: the round gathering appends.
        self._gathering: Round | None = None
        self._closing = False
        # The event loop's own: rounds not settled yet, oldest first.
        self._unsettled: dict[Round, None] = {}
        # Rows per statement: as many as SQLite's limit on parameters allows, up to 4096.
        limit = connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // _COLUMNS
        self._most_rows = min(_MOST_ROWS, 1 << (limit.bit_length() - 1))
        self._thread = threading.Thread(
            target=self._serve, name=f"turnkeeper SQLite writer {path}", daemon=True
        )
        self._thread.start()

    async def append(self, batch: Batch) -> None:
        """Commit `batch` in the next round; raises its LogError (SeqConflict, say).

        Cancelled before its round is taken, the append is not written; after, it is, and
        the cancellation waits for the commit: once it is raised, `last_seq` tells.
        """
        pending = Pending(batch)
        # The condition's own lock, taken in C: `with self._work` goes through two Python
        # methods, on every append.
        with self._lock:
            round_ = self._gathering
            if round_ is None:
                round_ = self._gathering = Round()
                self._unsettled[round_] = None
                self._work.notify()
            round_.pendings.append(pending)
        try:
            await round_.done.wait()
        except BaseException:
            with self._lock:
                taken = round_.taken
                if not taken:
                    round_.pendings.remove(pending)
            if taken:
                with anyio.CancelScope(shield=True):
                    await round_.done.wait()
            raise
        if pending.error is not None:
            raise pending.error

    async def close(self) -> None:
        """Wait for every append in flight, then stop the thread (which stops the
        checkpointer and closes the connection)."""
        while self._unsettled:
            await next(iter(self._unsettled)).done.wait()
        with self._work:
            self._closing = True
            self._work.notify()
        await anyio.to_thread.run_sync(self._thread.join)

    def _settle(self, round_: Round) -> None:
        """On the event loop: the round's outcomes are in; wake its tasks."""
        round_.settled = True
        del self._unsettled[round_]
        round_.done.set()

    def _serve(self) -> None:
        """In the writer thread: commit whatever has queued, round after round, until closed."""
        try:
            self._commit_rounds()
        finally:
            self._checkpointer.close()
            self._connection.close()

    def _commit_rounds(self) -> None:
        while True:
            with self._work:
                while self._gathering is None and not self._closing:
                    self._work.wait()
                round_ = self._gathering
                if round_ is None:
                    return
                self._gathering = None
                round_.taken = True
            pendings = round_.pendings
            try:
                outcomes = self._commit([pending.batch for pending in pendings])
            except Exception as exc:
                # A bug, not a SQLite error: each append hears of it, and the thread goes on.
                failure = LogError(f"{self.path}: the writer failed: {exc!r}")
                outcomes = [failure for _ in pendings]
            for pending, outcome in zip(pendings, outcomes, strict=True):
                pending.error = outcome
            token = self._token
            try:
                token.backend_class.run_sync_soon(self._settle, (round_,), token.native_token)
            except anyio.RunFinishedError:
                # The event loop has ended without closing the log: nobody waits.
                return

    def _commit(self, batches: list[Batch]) -> list[LogError | None]:
        """Write every batch whose expected seq holds, in one transaction: one statement
        (see `_INSERT`), or, for a round too large for one or holding two appends of a
        session, a statement per group of batches (see `_groups`)."""
        outcomes: list[LogError | None] = [None] * len(batches)
        groups = _groups(batches, self._most_rows)
        connection = self._connection
        try:
            if len(groups) == 1 and not self._too_long(batches[groups[0][0]]):
                written = self._write_group(groups[0], batches, outcomes)
            else:
                with transaction(connection):
                    written = 0
                    for group in groups:
                        if self._too_long(batches[group[0]]):
                            written += self._write_long(group[0], batches[group[0]], outcomes)
                        else:
                            written += self._write_group(group, batches, outcomes)
        except sqlite3.Error as exc:
            return [sqlite_error(self.path, exc) for _ in batches]
        except LogCorrupt as exc:
            return [LogCorrupt(str(exc)) for _ in batches]
        if written:
            self.commits += 1
            self._checkpointer.note_commit()
        return outcomes

    def _too_long(self, batch: Batch) -> bool:
        """Whether the batch is too long for one statement (and so alone in its group)."""
        return len(batch.events) > self._most_rows

    def _write_group(
        self, group: list[int], batches: list[Batch], outcomes: list[LogError | None]
    ) -> int:
        """Write the batches of `group` (of distinct sessions) in one statement; the
        number of rows written."""
        rows = [batches[index] for index in group]
        cursor = _insert(self._connection, [(batch, 0, len(batch.events)) for batch in rows])
        written = cursor.rowcount
        if written == sum(len(batch.events) for batch in rows):
            return written
        # Some expected seq did not hold (another writer's append came first). The rows
        # the statement inserted are the `written` last positions up to its last one.
        last = cursor.lastrowid
        assert last is not None
        inserted = set(self._connection.execute(_WRITTEN, (last - written, last)).fetchall())
        for index, batch in zip(group, rows, strict=True):
            if (batch.session_id, batch.events[0].seq) not in inserted:
                outcomes[index] = self._conflict(batch)
        return written

    def _write_long(self, index: int, batch: Batch, outcomes: list[LogError | None]) -> int:
        """Write a batch too long for one statement, by several, inside the transaction;
        none of it if one statement's check fails. The number of rows written."""
        connection = self._connection
        size = self._most_rows
        connection.execute("SAVEPOINT long_append")
        for start in range(0, len(batch.events), size):
            end = min(start + size, len(batch.events))
            if _insert(connection, [(batch, start, end)]).rowcount != end - start:
                connection.execute("ROLLBACK TO long_append")
                connection.execute("RELEASE long_append")
                outcomes[index] = self._conflict(batch)
                return 0
        connection.execute("RELEASE long_append")
        return len(batch.events)

    def _conflict(self, batch: Batch) -> LogError:
        """The conflict that kept the batch out: the session's last seq is not the one
        the batch expects, or is not a seq at all (LogCorrupt, for this batch alone: the
        others of its round are written)."""
        try:
            actual = last_seq(self._connection, self.path, batch.session_id)
        except LogCorrupt as exc:
            return exc
        return SeqConflict(batch.session_id, batch.expected_seq, actual)


@contextmanager
def transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """A write transaction around the block: committed if it returns, else rolled back."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def last_seq(connection: sqlite3.Connection, path: Path, session_id: str) -> int:
    """The session's last seq in the file; 0 if it has no events."""
    (seq,) = connection.execute(_LAST_SEQ, (session_id,)).fetchone()
    if seq is None:
        return 0
    if not isinstance(seq, int):
        raise LogCorrupt(f"{path}: session {session_id}: seq {seq!r} is not an integer")
    return seq


def sqlite_error(path: Path, exc: sqlite3.Error) -> LogError:
    """A turnkeeper error for a SQLite failure: LogCorrupt when the file is not a sound database."""
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
        return LogCorrupt(f"{path}: not a readable SQLite event log: {exc}")
    return LogError(f"{path}: {exc}")


def _groups(batches: list[Batch], most_rows: int) -> list[list[int]]:
    """The batches (by index, in order) in groups of at most `most_rows` rows, no session
    twice in a group (each row checks the file as it was before its statement), and a
    batch longer than that alone."""
    groups: list[list[int]] = []
    group: list[int] = []
    sessions: set[str] = set()
    rows = 0
    for index, batch in enumerate(batches):
        size = len(batch.events)
        if group and (batch.session_id in sessions or rows + size > most_rows):
            groups.append(group)
            group, sessions, rows = [], set(), 0
        group.append(index)
        sessions.add(batch.session_id)
        rows += size
    if group:
        groups.append(group)
    return groups


def _insert(connection: sqlite3.Connection, parts: list[tuple[Batch, int, int]]) -> sqlite3.Cursor:
    """Insert the events `start:end` of each batch in `parts`, each part's only if its
    session's last seq is the one before its first event. The cursor's `rowcount` is the
    number of rows inserted; `lastrowid` the position of the last."""
    values: list[str | int | float | bytes] = []
    place = 0
    for batch, start, end in parts:
        session_id = batch.session_id
        before = batch.expected_seq + start
        for envelope, line in zip(batch.events[start:end], batch.lines[start:end], strict=True):
            values += (session_id, envelope.seq, envelope.at, envelope.type, line, before, place)
            place += 1
    size = _SMALLEST
    while size < place:
        size *= 2
    for padding in range(place, size):
        values += (*_PADDING, padding)
    return connection.execute(_statement(size), values)


@functools.cache
def _statement(rows: int) -> str:
    """The insert statement for `rows` rows (see `_INSERT`)."""
    return _INSERT.format(rows=", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * rows))
