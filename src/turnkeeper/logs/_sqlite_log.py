"""An event log in one SQLite file (WAL mode): the embedded default."""

from __future__ import annotations

import fcntl
import io
import os
import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec
import structlog

from turnkeeper.core import LogCorrupt, LogError, SeqError, gc_paused
from turnkeeper.events import Envelope, decode_envelope, decode_envelopes
from turnkeeper.logs._log import Batch, EventLog
from turnkeeper.logs._sqlite_checkpointer import Checkpointer
from turnkeeper.logs._sqlite_file import (
    StoredChain,
    configured_connection,
    integrity_check,
    open_storage,
    stored_chains,
)
from turnkeeper.logs._sqlite_writer import Writer, last_seq, sqlite_error

_T = TypeVar("_T")

_logger = structlog.get_logger(__name__)

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
# Rows per page: large enough that the worker-thread hop is cheap next to decoding the
# page, small enough that decoding one (on the event loop) stays within milliseconds.
_PAGE = 4096
_integers = msgspec.json.Decoder(list[int])
_texts = msgspec.json.Decoder(list[str])


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

    # The writer takes each event's JSON, seq, time and type, not the event read back.
    _keeps_events = False
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
        storage = await anyio.to_thread.run_sync(open_storage, self.path, self.read_only)
        self._reader = storage.reader
        self._lock_fd = storage.lock_fd
        self._read_only_because = storage.read_only_because
        if storage.damage:
            _logger.error("sqlite log: damaged file", path=str(self.path), damage=storage.damage)
        if storage.writer is not None:
            try:
                checkpointer = Checkpointer(partial(configured_connection, self.path), self.path)
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
        return await self._on_reader(integrity_check)

    async def stored_chains(self) -> dict[str, StoredChain]:
        """Every session's rows as the events table holds them, read in position order
        from the table itself, not through the index reads use (for `turnkeeper check`,
        which holds them against what `read` returns). A session id that is not text is
        given as its repr."""
        await self._ready()
        return await self._on_reader(stored_chains)

    async def _on_reader(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `work` on the read connection in a worker thread, one at a time."""

        def guarded() -> _T:
            try:
                return work(self._reader)
            except sqlite3.Error as exc:
                raise sqlite_error(self.path, exc) from None

        return await anyio.to_thread.run_sync(guarded, limiter=self._read_limiter)


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
    # Compared a column at a time; a page that differs is walked to name its row. (Read
    # in comprehensions, whose attribute reads Python specialises: an attrgetter mapped
    # over the envelopes takes half as long again.)
    if [envelope.session_id for envelope in envelopes] != page.session_ids or [
        envelope.seq for envelope in envelopes
    ] != page.seqs:
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
