"""The SQLite log's writer: a thread that commits appends in rounds, one after another."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import msgspec

from turnkeeper.events._errors import LogCorrupt, LogError
from turnkeeper.events._log import Batch, SeqConflict

_LAST_SEQ = "SELECT max(seq) FROM events WHERE session_id = ?"
_INSERT_SESSION = "INSERT INTO sessions (session_id) VALUES (?)"
# Which of the ids in a JSON array are in the file: one statement for any number of them.
_KNOWN_IDS = "SELECT session_id FROM sessions WHERE session_id IN (SELECT value FROM json_each(?))"
# Events go in up to 64 rows per statement: a statement per row costs nearly twice as much
# (and each one lets go of the GIL). Sizes are powers of two, so a few statements serve.
_INSERT_SIZES = (64, 32, 16, 8, 4, 2, 1)
_INSERT_EVENTS = {
    size: "INSERT INTO events (session_id, seq, at, type, body) VALUES "
    + ", ".join(["(?, ?, ?, ?, ?)"] * size)
    for size in _INSERT_SIZES
}
# Sessions whose last seq the writer remembers; past this it starts again from empty.
_KNOWN_SESSIONS = 100_000

_json = msgspec.json.Encoder()


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
    thread takes the gathered round, one transaction, with no trip through the event loop
    in between, so an append waits for at most the round before its own. The thread
    tells the event loop through a socket: one waiting task watches it and settles every
    round committed since, waking each round's tasks once. The watcher hands the watch to
    the leader of another waiting round when it leaves.

    Each append's expected seq is checked inside the transaction; a conflict fails only
    that append. The writer remembers each session's last seq after its own commits, so a
    round needs no query per append; the memory is trusted only while `PRAGMA
    data_version` says no other connection has committed to the file since.
    """

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self.path = path
        self.commits = 0
        self._connection = connection
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
        # The thread's own: each session's last seq, valid for this data_version.
        self._last_seqs: dict[str, int] = {}
        self._data_version: int | None = None
        self._receive, self._send = socket.socketpair()
        self._receive.setblocking(False)
        self._thread = threading.Thread(
            target=self._serve, name=f"turnkeeper SQLite writer {path}", daemon=True
        )
        self._thread.start()

    async def append(self, batch: Batch) -> None:
        """Commit `batch` in the next round; raises its LogError (SeqConflict, say).

        Cancelled before its round is taken, the append is not written; after, it is.
        """
        pending = Pending(batch)
        with self._work:
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
                if not round_.taken:
                    round_.pendings.remove(pending)
            raise
        if pending.error is not None:
            raise pending.error

    async def close(self) -> None:
        """Wait for every append in flight, then stop the thread (which closes the connection)."""
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
        """Write every batch whose expected seq holds, in one transaction."""
        if not batches:
            return []
        connection = self._connection
        known = self._last_seqs
        outcomes: list[LogError | None] = []
        written: dict[str, int] = {}
        new_sessions: list[tuple[str]] = []
        # Each event's five column values, one after another.
        values: list[str | int | float | bytes] = []
        try:
            with transaction(connection):
                (version,) = connection.execute("PRAGMA data_version").fetchone()
                if version != self._data_version:
                    # Another connection has committed since this one last looked.
                    known.clear()
                    self._data_version = version
                self._learn(batches)
                for batch in batches:
                    session_id = batch.session_id
                    actual = written.get(session_id)
                    if actual is None:
                        actual = known.get(session_id)
                        if actual is None:
                            actual = last_seq(connection, self.path, session_id)
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
        except sqlite3.Error as exc:
            self._forget_last_seqs()
            return [sqlite_error(self.path, exc) for _ in batches]
        except LogCorrupt as exc:
            self._forget_last_seqs()
            return [LogCorrupt(str(exc)) for _ in batches]
        if values:
            self.commits += 1
            if len(known) > _KNOWN_SESSIONS:
                known.clear()
            known.update(written)
        return outcomes

    def _learn(self, batches: list[Batch]) -> None:
        """Remember as 0 the last seq of the round's sessions that are not in the file.

        One lookup for all of them instead of one query each: a round of new
        sessions (a worker starting thousands at once) would otherwise query every one.
        A session is in the sessions table exactly when it has events.
        """
        known = self._last_seqs
        unknown = list({batch.session_id for batch in batches if batch.session_id not in known})
        if not unknown:
            return
        found = {row[0] for row in self._connection.execute(_KNOWN_IDS, (_json.encode(unknown),))}
        for session_id in unknown:
            if session_id not in found:
                known[session_id] = 0

    def _forget_last_seqs(self) -> None:
        """After a failed transaction, learn each session's last seq from the file again."""
        self._last_seqs.clear()
        self._data_version = None


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


def _insert_events(connection: sqlite3.Connection, values: list[str | int | float | bytes]) -> None:
    """Insert events from their column values, five per event, with few statements."""
    start = 0
    for size in _INSERT_SIZES:
        width = 5 * size
        while len(values) - start >= width:
            connection.execute(_INSERT_EVENTS[size], values[start : start + width])
            start += width
