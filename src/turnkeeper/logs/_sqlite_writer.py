"""The SQLite log's writer: a thread that commits appends in rounds, one after another."""

from __future__ import annotations

import contextlib
import functools
import socket
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
    """Appends committed in one transaction, and how their tasks wait for it.

    Its tasks wait on `done`, set once every append has its outcome; the first to wait
    while another task watches the socket waits on `lead` instead, so that the watch can
    be handed to exactly one task of the round.
    """

    __slots__ = ("done", "lead", "pendings", "settled", "taken")

    def __init__(self) -> None:
        self.pendings: list[Pending] = []
        # Set by the writer thread, under its lock, when it takes the round.
        self.taken = False
        self.settled = False
        self.done = anyio.Event()
        self.lead: anyio.Event | None = None


class Writer:
    """Commits appends on `connection` in a thread of its own.

    Appends gather in a round while the round before commits; as soon as it has, the
    thread takes the gathered round, with no trip through the event loop in between, so
    an append waits for at most the round before its own. The thread tells the event
    loop through a socket: one waiting task watches it and settles every round committed
    since, waking each round's tasks once. The watcher hands the watch to the leader of
    another waiting round when it leaves.

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
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        # Shared with the thread, under the lock: the round gathering appends, the rounds
        # committed but not settled yet, and whether the socket has been written since.
        self._gathering: Round | None = None
        self._committed: list[Round] = []
        self._signalled = False
        self._closing = False
        # The event loop's own: rounds not settled yet (oldest first), whether a task
        # watches the socket, and the rounds whose leader waits, oldest first.
        self._unsettled: dict[Round, None] = {}
        self._watched = False
        self._leaders: dict[Round, None] = {}
        # Rows per statement: as many as SQLite's limit on parameters allows, up to 4096.
        limit = connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // _COLUMNS
        self._most_rows = min(_MOST_ROWS, 1 << (limit.bit_length() - 1))
        self._receive, self._send = socket.socketpair()
        self._receive.setblocking(False)
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
            await self._wait(round_)
        except BaseException:
            with self._lock:
                taken = round_.taken
                if not taken:
                    round_.pendings.remove(pending)
            if taken:
                with anyio.CancelScope(shield=True):
                    await self._wait(round_)
            raise
        if pending.error is not None:
            raise pending.error

    async def close(self) -> None:
        """Wait for every append in flight, then stop the thread (which stops the
        checkpointer and closes the connection)."""
        while self._unsettled:
            await self._wait(next(iter(self._unsettled)))
        with self._work:
            self._closing = True
            self._work.notify()
        await anyio.to_thread.run_sync(self._thread.join)
        self._receive.close()
        self._send.close()

    async def _wait(self, round_: Round) -> None:
        """Return once `round_` is settled, watching the socket while no other task does."""
        try:
            while not round_.settled:
                if not self._watched:
                    await self._watch(round_)
                elif round_.lead is None:
                    await self._lead(round_)
                else:
                    await round_.done.wait()
        except BaseException:
            if not round_.settled:
                # Cancelled (as its leader or watcher, perhaps): the round's other tasks
                # wake to choose another.
                done = round_.done
                round_.done = anyio.Event()
                done.set()
            raise
        finally:
            if not self._watched:
                # Leaving with nobody watching (settled, or cancelled): the leader of the
                # oldest round still waiting takes over the watch.
                for waiting in self._leaders:
                    assert waiting.lead is not None
                    waiting.lead.set()
                    break

    async def _watch(self, round_: Round) -> None:
        """Settle committed rounds as the thread reports them, until `round_` is settled."""
        self._watched = True
        try:
            while not round_.settled:
                await anyio.wait_readable(self._receive)
                self._settle()
        finally:
            self._watched = False

    async def _lead(self, round_: Round) -> None:
        """Wait as the round's leader: woken when it settles or when the watch is free."""
        lead = round_.lead = anyio.Event()
        self._leaders[round_] = None
        try:
            await lead.wait()
        finally:
            del self._leaders[round_]
            round_.lead = None

    def _settle(self) -> None:
        """Settle the rounds committed since the last look, waking their tasks."""
        # The thread writes one byte, then no more until the flag is cleared below.
        with contextlib.suppress(BlockingIOError):
            self._receive.recv(1)
        with self._lock:
            committed = self._committed
            self._committed = []
            self._signalled = False
        for round_ in committed:
            round_.settled = True
            del self._unsettled[round_]
            round_.done.set()
            if round_.lead is not None:
                round_.lead.set()

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
            with self._lock:
                self._committed.append(round_)
                signal = not self._signalled
                self._signalled = True
            if signal:
                self._send.send(b"\0")

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
