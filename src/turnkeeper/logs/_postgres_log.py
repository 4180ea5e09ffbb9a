"""An event log in PostgreSQL, shared by many workers: the store of a fleet."""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, TypeVar

import anyio
import msgspec
import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from turnkeeper.core import (
    InputError,
    LogCorrupt,
    LogError,
    SeqError,
    check_count,
    check_seconds,
    encodes,
    gc_paused,
)
from turnkeeper.events import Envelope, decode_envelope, decode_envelopes
from turnkeeper.logs._log import Batch, check_batch, check_session_id
from turnkeeper.logs._postgres_schema import channel_of, ensure_schema
from turnkeeper.logs._postgres_waiters import Listener, Waiters
from turnkeeper.logs._postgres_writer import Write, Writer, database_error
from turnkeeper.logs._shared import Claim, Consumed, FenceLost, InboxItem, Posted, SharedLog

_T = TypeVar("_T")
Connection = psycopg.Connection[Any]

# Rows per page of a read: the thread hop is cheap next to decoding the page, and decoding
# one stays within milliseconds.
_PAGE = 4096
_SESSION_PAGE = """SELECT count(*), min(seq), max(seq),
    convert_to(string_agg(body, E'\\n' ORDER BY seq), 'UTF8')
    FROM (SELECT seq, body FROM turnkeeper_events WHERE session_id = %s AND seq > %s
          ORDER BY seq LIMIT %s) page"""
_SESSION_ROWS = """SELECT seq, body FROM turnkeeper_events WHERE session_id = %s AND seq > %s
    ORDER BY seq LIMIT %s"""
_ALL_PAGE = """SELECT count(*), array_agg(pos ORDER BY pos), array_agg(session_id ORDER BY pos),
    array_agg(seq ORDER BY pos), convert_to(string_agg(body, E'\\n' ORDER BY pos), 'UTF8')
    FROM (SELECT pos, session_id, seq, body FROM turnkeeper_events WHERE pos > %s
          ORDER BY pos LIMIT %s) page"""
_ALL_ROWS = """SELECT pos, session_id, seq, body FROM turnkeeper_events WHERE pos > %s
    ORDER BY pos LIMIT %s"""
_LAST_SEQ = "SELECT last_seq FROM turnkeeper_sessions WHERE session_id = %s"
_SESSIONS = """SELECT session_id FROM turnkeeper_sessions WHERE first_pos IS NOT NULL
    ORDER BY first_pos"""
_REGISTER = """INSERT INTO turnkeeper_workers (name, expires)
    VALUES (%s, now() + %s * interval '1 second') RETURNING id"""
_RENEW = "UPDATE turnkeeper_workers SET expires = now() + %s * interval '1 second' WHERE id = %s"
_REREGISTER = """INSERT INTO turnkeeper_workers (id, name, expires)
    VALUES (%s, %s, now() + %s * interval '1 second') ON CONFLICT (id) DO NOTHING"""
# After a lapse: who owns the sessions this worker held, at what epoch. FOR KEY SHARE waits
# for the claims that hold one of their rows (FOR UPDATE) to end, and conflicts with
# nothing else (not the appends' row updates).
_OWNERS = """SELECT t.session_id, t.owner, t.epoch, w.name FROM turnkeeper_sessions t
    LEFT JOIN turnkeeper_workers w ON w.id = t.owner
    WHERE t.session_id = ANY(%s) ORDER BY t.session_id FOR KEY SHARE OF t"""
# The takeover scan: sessions of workers whose lease has expired, and sessions with no
# owner that have work waiting. Two statements in one transaction: the first locks the
# rows (skipping those another worker is claiming), the second claims those that still
# need it on a snapshot of its own, taken after the locks. So a worker that renewed its
# lease before the second began keeps its sessions, and one that validates its sessions
# after renewing (_OWNERS, which waits for these locks) sees every claim of them that
# did not see the renewal.
_NEEDS_OWNER = """((t.owner IS NULL AND (t.active OR t.inbox_pending > 0)) OR t.owner IN (
        SELECT w.id FROM turnkeeper_workers w WHERE w.expires < now() AND w.id <> %(me)s))"""
_CLAIM_LOCK = f"""SELECT t.session_id FROM turnkeeper_sessions t WHERE {_NEEDS_OWNER}
    LIMIT %(limit)s FOR UPDATE OF t SKIP LOCKED"""
_CLAIM = f"""WITH chosen AS (
        SELECT t.session_id, t.owner AS previous FROM turnkeeper_sessions t
        WHERE t.session_id = ANY(%(locked)s) AND {_NEEDS_OWNER}
    )
    UPDATE turnkeeper_sessions t SET owner = %(me)s, epoch = t.epoch + 1
    FROM chosen WHERE t.session_id = chosen.session_id
    RETURNING t.session_id, t.epoch, t.last_seq,
        (SELECT w.name FROM turnkeeper_workers w WHERE w.id = chosen.previous)"""
# Workers long dead that own nothing any more.
_FORGET_WORKERS = """DELETE FROM turnkeeper_workers w
    WHERE w.expires < now() - interval '10 minutes' AND w.id <> %s
    AND NOT EXISTS (SELECT 1 FROM turnkeeper_sessions t WHERE t.owner = w.id)"""
# One session, claimed as the scan claims (the row locked first, then claimed on a
# snapshot taken after the lock); no row if another live worker owns it, or it has no row.
_LOCK_ONE = "SELECT 1 FROM turnkeeper_sessions WHERE session_id = %s FOR UPDATE"
_CLAIM_ONE = """WITH chosen AS (
        SELECT t.session_id, t.owner AS previous FROM turnkeeper_sessions t
        WHERE t.session_id = %(session)s
    )
    UPDATE turnkeeper_sessions t SET owner = %(me)s,
        epoch = CASE WHEN chosen.previous IS NOT DISTINCT FROM %(me)s THEN t.epoch
            ELSE t.epoch + 1 END
    FROM chosen WHERE t.session_id = chosen.session_id AND (
        chosen.previous IS NULL OR chosen.previous = %(me)s OR NOT EXISTS (
            SELECT 1 FROM turnkeeper_workers w
            WHERE w.id = chosen.previous AND w.expires >= now()))
    RETURNING t.epoch, t.last_seq, chosen.previous,
        (SELECT w.name FROM turnkeeper_workers w WHERE w.id = chosen.previous)"""
_RELEASE = """UPDATE turnkeeper_sessions SET owner = NULL, active = %s
    WHERE owner = %s AND session_id = ANY(%s) RETURNING session_id"""
_RELEASE_ALL = """UPDATE turnkeeper_sessions SET owner = NULL, active = %s
    WHERE owner = %s RETURNING session_id"""
_LEAVE = "DELETE FROM turnkeeper_workers WHERE id = %s"
_POST = """INSERT INTO turnkeeper_inbox (session_id, request_id, kind, payload)
    VALUES (%s, %s, %s, %s) ON CONFLICT (session_id, request_id) DO NOTHING
    RETURNING id, extract(epoch FROM posted)::double precision"""
_POSTED = """SELECT id, kind, payload, extract(epoch FROM posted)::double precision
    FROM turnkeeper_inbox WHERE session_id = %s AND request_id = %s"""
_PENDING = """INSERT INTO turnkeeper_sessions (session_id, inbox_pending) VALUES (%s, 1)
    ON CONFLICT (session_id) DO UPDATE
    SET inbox_pending = turnkeeper_sessions.inbox_pending + 1"""
_ITEM_COLUMNS = """i.id, i.session_id, i.kind, i.payload, i.request_id,
    extract(epoch FROM i.posted)::double precision"""
_INBOX_OF = f"""SELECT {_ITEM_COLUMNS} FROM turnkeeper_inbox i
    WHERE i.session_id = %s AND i.consumed IS NULL ORDER BY i.id"""
_INBOX_HELD = f"""SELECT {_ITEM_COLUMNS} FROM turnkeeper_inbox i
    JOIN turnkeeper_sessions t ON t.session_id = i.session_id
    WHERE t.owner = %s AND i.consumed IS NULL ORDER BY i.id"""
_OUTCOME = (
    "SELECT consumed IS NOT NULL, consumed_epoch, outcome FROM turnkeeper_inbox WHERE id = %s"
)
_POSTGRES_NAME = re.compile(r"postgres(ql)?://|\s*[A-Za-z_]+\s*=")
_payload_encoder = msgspec.json.Encoder()
_payload_decoder = msgspec.json.Decoder()
# A lease is renewed four times over, so that one failed renewal leaves it three
# quarters of its length; it is no longer held once a quarter is left.
_RENEWALS_PER_LEASE = 4
_HELD_MARGIN = 0.25


class PostgresLog(SharedLog):
    """An event log in the PostgreSQL database at `url` (a libpq URL or conninfo string),
    shared by every worker (every open PostgresLog) on it; see SharedLog for ownership,
    fencing, the inbox and waiting. Its tables are in the first schema of the search path
    (`?options=-csearch_path%3Dname` in the URL picks another), created and migrated by the
    log as it opens (see `_postgres_schema`).

    Group commit: appends that arrive while a round is being committed gather, and a
    writer thread commits all of them in the next round, one transaction and one trip to
    the server (see `Writer`). Each append's fence and expected seq are checked inside the
    transaction; a conflict fails only that append. An append returns once its commit is
    flushed (`synchronous_commit` on, whatever the server's default). Positions increase
    in commit order. `commits` counts the rounds that wrote.

    All database work runs in threads on connections from a pool of at most
    `max_connections` (reads in worker threads, commits in the writer's), and two threads
    of the log's own: one renews the worker's lease every quarter of `lease` seconds, one
    listens for notifications and re-checks waiters' sessions every `requery` seconds.
    A log opened `read_only` is no worker: it reads, and its writes raise LogError.

    A failed connection fails what was running on it (an append then may or may not have
    been logged, as when it is cancelled: `last_seq` tells) and the pool connects anew.
    """

    # The writer takes each event's JSON, time and type, not the event read back.
    _keeps_events = False
    _writer: Writer
    _pool: psycopg_pool.ConnectionPool[Connection]
    _waiters: Waiters
    _listener: Listener
    _token: anyio.lowlevel.EventLoopToken

    def __init__(
        self,
        url: str,
        *,
        worker_id: str | None = None,
        lease: float = 10.0,
        requery: float = 1.0,
        max_connections: int = 10,
        read_only: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(url, str):
            raise InputError(f"url: expected a PostgreSQL URL, got {url!r:.80}")
        try:
            parts = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise InputError(f"url: not a PostgreSQL URL or conninfo string: {exc}") from None
        check_seconds("lease", lease, positive=True)
        check_seconds("requery", requery, positive=True)
        check_count("max_connections", max_connections, 2)
        if worker_id is None:
            worker_id = f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(worker_id, str) or not worker_id or not encodes(worker_id):
            raise InputError(f"worker_id: expected a non-empty UTF-8 string, got {worker_id!r:.80}")
        self.url = url
        self.read_only = read_only
        self.requery = float(requery)
        self.max_connections = max_connections
        shown = {key: str(value) for key, value in parts.items() if key != "password"}
        self._where = f"PostgreSQL {make_conninfo(**shown)}"
        self._worker_id = worker_id
        self._lease = float(lease)
        self._worker = 0
        self._channel = ""
        self._held: dict[str, int] = {}
        self._lost: dict[str, FenceLost] = {}
        self._takeovers = 0
        self._fence_losses = 0
        self._lease_until = 0.0
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __repr__(self) -> str:
        suffix = ", read_only=True" if self.read_only else ""
        return f"PostgresLog({self._where.removeprefix('PostgreSQL ')!r}{suffix})"

    @property
    def commits(self) -> int:
        """Rounds committed so far that wrote something."""
        return self._writer.commits if self._writes() and self._state == "open" else 0

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def lease(self) -> float:
        return self._lease

    @property
    def lease_held(self) -> bool:
        if self._state != "open" or self.read_only:
            return False
        return self._lease_live(time.monotonic())

    @property
    def takeovers(self) -> int:
        return self._takeovers

    @property
    def fence_losses(self) -> int:
        return self._fence_losses

    def epoch(self, session_id: str) -> int | None:
        return self._held.get(session_id)

    def held(self) -> dict[str, int]:
        return dict(self._held)

    # -- opening and closing ----------------------------------------------------------------

    def _writes(self) -> bool:
        return not self.read_only

    async def _open(self) -> None:
        # One call in a thread: a cancelled open either fails there (which lets go of what
        # it took) or opens the log whole, for `close` to release.
        await anyio.to_thread.run_sync(self._connect)
        self._waiters = Waiters()
        self._listener = Listener(self.url, self._where, self._channel, self.requery, self._waiters)
        if not self.read_only:
            self._writer = Writer(
                self._connect_writer, self._where, self._worker, self._channel, self._settle
            )
            self._token = anyio.lowlevel.current_token()
            self._heartbeat = threading.Thread(
                target=self._beat, name=f"turnkeeper heartbeat {self._where}", daemon=True
            )
            self._heartbeat.start()

    def _connect(self) -> None:
        """In a thread: make or check the schema and register the worker, on a connection
        of its own (so that a server out of reach fails the open at once), then open the
        pool."""
        try:
            with psycopg.connect(self.url, autocommit=True) as connection:
                ensure_schema(connection, self._where)
                self._channel = channel_of(connection)
                if not self.read_only:
                    sent = time.monotonic()
                    row = connection.execute(_REGISTER, (self._worker_id, self._lease)).fetchone()
                    assert row is not None
                    self._worker = row[0]
                    self._lease_until = sent + self._lease
        except psycopg.Error as exc:
            raise database_error(self._where, exc) from None
        self._pool = psycopg_pool.ConnectionPool(
            self.url,
            min_size=1,
            max_size=self.max_connections,
            kwargs={"autocommit": True},
            configure=_configure,
            open=False,
            timeout=10.0,
            name=self._where,
        )
        self._pool.open(wait=False)

    def _connect_writer(self) -> Connection:
        """A connection for the writer, configured as the pool's are."""
        connection = psycopg.connect(self.url, autocommit=True)
        try:
            _configure(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    async def _close(self) -> None:
        try:
            if not self.read_only:
                await self._writer.close()
                self._stop.set()
                if self._heartbeat is not None:
                    await anyio.to_thread.run_sync(self._heartbeat.join)
                self._held.clear()
                await self._on_connection(self._leave, again=True)
        finally:
            self._listener.stop()
            # Wakes the listening thread at once, to see that it is closing.
            with contextlib.suppress(LogError):
                await self._on_connection(self._wake_listener, again=True)
            await self._listener.close()
            await anyio.to_thread.run_sync(self._pool.close)

    def _wake_listener(self, connection: Connection) -> None:
        connection.execute("SELECT pg_notify(%s, '{}')", (self._channel,))

    def _leave(self, connection: Connection) -> None:
        """Release every session this worker owns (each stays active, for another worker to
        take at once) and remove its worker row."""
        with connection.transaction():
            connection.execute(_RELEASE_ALL, (True, self._worker))
            connection.execute(_LEAVE, (self._worker,))

    def _beat(self) -> None:
        """In the heartbeat thread: renew the lease until closed, sooner after a failure,
        on a connection of its own (so that no number of reads can hold a renewal up).

        A renewal after a lapse (sent once the lease was no longer held: the worker was
        paused, or cut off from the database) may come after other workers took sessions
        of this one. It finds out which (`_OWNERS`) and lets go of them (`_validated`)
        before the lease is held again, so that no claim of this worker's is trusted
        that was taken meanwhile."""
        interval = self._lease / _RENEWALS_PER_LEASE
        wait = interval
        connection: Connection | None = None
        try:
            while not self._stop.wait(wait):
                sent = time.monotonic()
                lapsed = not self._lease_live(sent)
                held = dict(self._held) if lapsed else {}
                try:
                    if connection is None or connection.broken:
                        if connection is not None:
                            connection.close()
                        connection = None
                        connection = psycopg.connect(
                            self.url, autocommit=True, connect_timeout=max(2, int(interval))
                        )
                    renewed = connection.execute(_RENEW, (self._lease, self._worker))
                    if renewed.rowcount == 0:
                        # Its row was taken for dead and removed: the sessions it owned are
                        # no longer its own, and the fence says so to any write of theirs.
                        connection.execute(
                            _REREGISTER, (self._worker, self._worker_id, self._lease)
                        )
                    owners = connection.execute(_OWNERS, (list(held),)).fetchall() if held else []
                except psycopg.Error:
                    wait = min(1.0, interval)
                    continue
                if lapsed:
                    try:
                        anyio.from_thread.run_sync(
                            self._validated, held, owners, sent + self._lease, token=self._token
                        )
                    except anyio.RunFinishedError:
                        # The event loop has ended without closing the log: nobody holds.
                        return
                else:
                    self._lease_until = sent + self._lease
                wait = interval
        finally:
            if connection is not None:
                connection.close()

    def _validated(
        self, held: dict[str, int], owners: list[tuple[Any, ...]], lease_until: float
    ) -> None:
        """On the event loop, after a renewal that followed a lapse: let go of the sessions
        held then (`held`) that another worker has claimed since (`owners`: each one's
        owner and epoch now), as a fence lost, then hold the lease again."""
        now = {session_id: (owner, epoch, name) for session_id, owner, epoch, name in owners}
        for session_id, epoch in held.items():
            owner, current, name = now.get(session_id, (None, 0, None))
            if (owner, current) == (self._worker, epoch) or self._held.get(session_id) != epoch:
                # Still this worker's; or claimed again since `held` was read.
                continue
            del self._held[session_id]
            self._lost[session_id] = FenceLost(session_id, held=epoch, owner=name, epoch=current)
        self._lease_until = lease_until

    def _lease_live(self, now: float) -> bool:
        return now < self._lease_until - self._lease * _HELD_MARGIN

    # -- appends --------------------------------------------------------------------------

    async def _append(self, batch: Batch) -> None:
        events = batch.events
        await self._write(
            Write(
                batch.session_id,
                batch.expected_seq,
                batch.lines,
                [envelope.at for envelope in events],
                [envelope.type for envelope in events],
                0,
            )
        )

    async def _write(self, write: Write) -> None:
        """Fence `write` by the epoch held, and commit it."""
        if self.read_only:
            raise LogError(f"{self._where}: this log only reads: it was opened read_only")
        lost = self._lost.get(write.session_id)
        if lost is not None:
            self._fence_losses += 1
            raise FenceLost(lost.session_id, held=lost.held, owner=lost.owner, epoch=lost.epoch)
        write.held = self._held.get(write.session_id, 0)
        await self._writer.write(write)

    def _settle(self, writes: list[Write]) -> None:
        """On the event loop, as a round settles: hold what its writes claimed, and let go
        of what they found lost."""
        for write in writes:
            error = write.error
            if error is None:
                if write.epoch > self._held.get(write.session_id, 0):
                    self._held[write.session_id] = write.epoch
            elif isinstance(error, FenceLost):
                self._fence_losses += 1
                self._held.pop(write.session_id, None)
                self._lost[write.session_id] = error

    # -- reads ----------------------------------------------------------------------------

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        events: list[Envelope] = []
        with gc_paused():
            while limit is None or len(events) < limit:
                size = _PAGE if limit is None else min(_PAGE, limit - len(events))
                work = partial(
                    self._session_page, session_id=session_id, after=after + len(events), size=size
                )
                page = await self._on_connection(work, again=True)
                events.extend(page)
                if len(page) < size:
                    break
        return events

    def _session_page(
        self, connection: Connection, *, session_id: str, after: int, size: int
    ) -> list[Envelope]:
        """In a thread: the session's events after seq `after`, at most `size`, checked to
        follow one another and to be the rows they are stored in."""
        cursor = connection.cursor(binary=True)
        row = cursor.execute(_SESSION_PAGE, (session_id, after, size)).fetchone()
        assert row is not None
        count, first, last, joined = row
        if not count:
            return []
        lines = io.BytesIO(joined).readlines()
        if first != after + 1 or last != after + count or len(lines) != count:
            # A gap, or a body holding a newline (written by hand): row by row, to name it.
            rows = cursor.execute(_SESSION_ROWS, (session_id, after, size)).fetchall()
            expected = after + 1
            for seq, _ in rows:
                if seq != expected:
                    error = SeqError(session_id, seq, expected)
                    error.args = (f"{self._where}: {error}",)
                    raise error
                expected += 1
            lines = [body for _, body in rows]
        seqs = range(after + 1, after + count + 1)
        return self._decoded(lines, [session_id] * count, list(seqs))

    async def _read_all(self, after: int, limit: int | None) -> list[tuple[int, Envelope]]:
        found: list[tuple[int, Envelope]] = []
        with gc_paused():
            while limit is None or len(found) < limit:
                size = _PAGE if limit is None else min(_PAGE, limit - len(found))
                start = found[-1][0] if found else after
                page = await self._on_connection(
                    partial(self._all_page, after=start, size=size), again=True
                )
                found.extend(page)
                if len(page) < size:
                    break
        return found

    def _all_page(
        self, connection: Connection, *, after: int, size: int
    ) -> list[tuple[int, Envelope]]:
        """In a thread: the events at positions after `after`, at most `size`, checked to
        be the rows they are stored in."""
        cursor = connection.cursor(binary=True)
        row = cursor.execute(_ALL_PAGE, (after, size)).fetchone()
        assert row is not None
        count, positions, session_ids, seqs, joined = row
        if not count:
            return []
        lines = io.BytesIO(joined).readlines()
        if len(lines) != count:
            rows = cursor.execute(_ALL_ROWS, (after, size)).fetchall()
            positions = [pos for pos, _, _, _ in rows]
            lines = [body for _, _, _, body in rows]
        return list(zip(positions, self._decoded(lines, session_ids, seqs), strict=True))

    def _decoded(
        self, lines: Sequence[bytes | str], session_ids: list[str], seqs: list[int]
    ) -> list[Envelope]:
        """The envelopes in `lines`, each the event of its row's session id and seq; else
        LogCorrupt naming the first row that is not."""
        try:
            envelopes = decode_envelopes([_as_bytes(line) for line in lines])
        except LogCorrupt:
            envelopes = []
            for session_id, seq, line in zip(session_ids, seqs, lines, strict=True):
                try:
                    envelopes.append(decode_envelope(line))
                except LogCorrupt as exc:
                    raise LogCorrupt(
                        f"{self._where}: session {session_id} seq {seq}: {exc}"
                    ) from None
        for session_id, seq, envelope in zip(session_ids, seqs, envelopes, strict=True):
            if envelope.session_id != session_id or envelope.seq != seq:
                raise LogCorrupt(
                    f"{self._where}: session {session_id} seq {seq}: body holds session "
                    f"{envelope.session_id} seq {envelope.seq} instead"
                )
        return envelopes

    async def _last_seq(self, session_id: str) -> int:
        def last_seq(connection: Connection) -> int:
            row = connection.execute(_LAST_SEQ, (session_id,)).fetchone()
            return 0 if row is None else int(row[0])

        return await self._on_connection(last_seq, again=True)

    async def _sessions(self) -> list[str]:
        def sessions(connection: Connection) -> list[str]:
            return [row[0] for row in connection.execute(_SESSIONS)]

        return await self._on_connection(sessions, again=True)

    async def _on_connection(self, work: Callable[[Connection], _T], *, again: bool = False) -> _T:
        """Run `work` on a pooled connection in a worker thread; `again` (for work that
        changes nothing) on another connection while the server has dropped the one it ran
        on, as it has every idle connection after a restart."""

        def guarded() -> _T:
            for attempt in range(self.max_connections + 1):
                try:
                    with self._pool.connection() as connection:
                        try:
                            return work(connection)
                        except psycopg.OperationalError:
                            if (
                                not again
                                or not connection.broken
                                or attempt == self.max_connections
                            ):
                                raise
                except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                    raise database_error(self._where, exc) from None
            raise AssertionError("the last attempt returns or raises")

        return await anyio.to_thread.run_sync(guarded)

    # -- ownership --------------------------------------------------------------------------

    async def claim(self, *, limit: int = 100) -> list[Claim]:
        check_count("limit", limit, 1)
        await self._ready_to_write()

        def claim(connection: Connection) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = []
            with connection.transaction():
                parameters: dict[str, Any] = {"me": self._worker, "limit": limit}
                locked = [row[0] for row in connection.execute(_CLAIM_LOCK, parameters)]
                if locked:
                    parameters["locked"] = locked
                    rows = connection.execute(_CLAIM, parameters).fetchall()
            connection.execute(_FORGET_WORKERS, (self._worker,))
            return rows

        claims = []
        for session_id, epoch, last_seq, previous in await self._on_connection(claim):
            claims.append(self._hold(Claim(session_id, epoch, last_seq, previous)))
        return claims

    async def claim_session(self, session_id: str) -> Claim | None:
        check_session_id(session_id)
        await self._ready_to_write()
        if not encodes(session_id):
            return Claim(session_id, 0, 0)

        def claim(connection: Connection) -> tuple[Any, ...] | None:
            # One trip to the server for the transaction's four statements.
            with connection.pipeline(), connection.transaction():
                exists = connection.execute(_LOCK_ONE, (session_id,))
                claimed = connection.execute(
                    _CLAIM_ONE, {"me": self._worker, "session": session_id}
                )
            if exists.fetchone() is None:
                return ()
            return claimed.fetchone()

        found = await self._on_connection(claim, again=True)
        if found is None:
            return None
        if not found:
            # No events and no claim yet: its first append claims it.
            return Claim(session_id, 0, 0)
        epoch, last_seq, previous, previous_name = found
        taken_from = None if previous == self._worker else previous_name
        return self._hold(Claim(session_id, epoch, last_seq, taken_from))

    def _hold(self, claim: Claim) -> Claim:
        """Hold a claim made (a takeover, if it was taken from another worker)."""
        if claim.taken_from is not None:
            self._takeovers += 1
        self._lost.pop(claim.session_id, None)
        self._held[claim.session_id] = max(claim.epoch, self._held.get(claim.session_id, 0))
        return claim

    async def release(
        self, session_ids: Iterable[str] | None = None, *, active: bool = False
    ) -> list[str]:
        await self._ready_to_write()
        chosen = None if session_ids is None else list(session_ids)
        if chosen is not None:
            for session_id in chosen:
                check_session_id(session_id)
            chosen = [session_id for session_id in chosen if encodes(session_id)]

        def release(connection: Connection) -> list[str]:
            if chosen is None:
                rows = connection.execute(_RELEASE_ALL, (bool(active), self._worker))
            else:
                rows = connection.execute(_RELEASE, (bool(active), self._worker, chosen))
            return [row[0] for row in rows]

        released = await self._on_connection(release, again=True)
        for session_id in self._held.copy() if chosen is None else chosen:
            self._held.pop(session_id, None)
        return released

    async def _ready_to_write(self) -> None:
        await self._ready()
        if self.read_only:
            raise LogError(f"{self._where}: this log only reads: it was opened read_only")

    # -- the inbox --------------------------------------------------------------------------

    async def post(
        self, session_id: str, kind: str, payload: Any, *, request_id: str | None = None
    ) -> Posted:
        check_session_id(session_id)
        for name, value, optional in (
            ("session_id", session_id, False),
            ("kind", kind, False),
            ("request_id", request_id, True),
        ):
            if optional and value is None:
                continue
            if not isinstance(value, str) or not value or not encodes(value):
                raise InputError(f"{name}: expected a non-empty UTF-8 string, got {value!r:.80}")
        try:
            text = _payload_encoder.encode(payload).decode()
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise InputError(f"payload: cannot be JSON: {exc}") from None
        if not encodes(text):
            raise InputError("payload: holds a lone surrogate, which the log cannot hold")
        await self._ready()

        def post(connection: Connection) -> Posted:
            with connection.transaction():
                row = connection.execute(_POST, (session_id, request_id, kind, text)).fetchone()
                if row is not None:
                    connection.execute(_PENDING, (session_id,))
                    notice = _payload_encoder.encode({"i": [session_id]}).decode()
                    connection.execute("SELECT pg_notify(%s, %s)", (self._channel, notice))
                    item = InboxItem(row[0], session_id, kind, payload, request_id, row[1])
                    return Posted(item, duplicate=False)
                first = connection.execute(_POSTED, (session_id, request_id)).fetchone()
                assert first is not None
            item_id, first_kind, first_payload, posted_at = first
            if (first_kind, first_payload) != (kind, text):
                raise InputError(
                    f"request_id {request_id!r:.80}: already used for another {first_kind} "
                    f"request of session {session_id}"
                )
            item = InboxItem(item_id, session_id, kind, payload, request_id, posted_at)
            return Posted(item, duplicate=True)

        return await self._on_connection(post)

    async def inbox(self, session_id: str | None = None) -> list[InboxItem]:
        if session_id is not None:
            check_session_id(session_id)
            if not encodes(session_id):
                return []
        await self._ready()

        def inbox(connection: Connection) -> list[tuple[Any, ...]]:
            if session_id is None:
                return connection.execute(_INBOX_HELD, (self._worker,)).fetchall()
            return connection.execute(_INBOX_OF, (session_id,)).fetchall()

        rows = await self._on_connection(inbox, again=True)
        return [_item(self._where, *row) for row in rows]

    async def consume(
        self,
        item: InboxItem,
        events: Sequence[Envelope] = (),
        *,
        expected_seq: int,
        outcome: str | None = None,
    ) -> None:
        if not isinstance(item, InboxItem):
            raise LogError(f"item must be an InboxItem, got {type(item).__name__}")
        if outcome is not None and (not isinstance(outcome, str) or not encodes(outcome)):
            raise InputError(f"outcome: expected None or a UTF-8 string, got {outcome!r:.80}")
        if events:
            batch = check_batch(events, expected_seq, read_back=self._keeps_events)
            if batch.session_id != item.session_id:
                raise LogError(
                    f"inbox item {item.id} is session {item.session_id}'s; its events must "
                    f"be too, not {batch.session_id}'s"
                )
            lines, ats = batch.lines, [envelope.at for envelope in batch.events]
            types = [envelope.type for envelope in batch.events]
        else:
            check_batch_seq(expected_seq)
            lines, ats, types = (), [], []
        await self._ready()
        write = Write(item.session_id, expected_seq, lines, ats, types, 0, ((item.id, outcome),))
        await self._write(write)

    async def outcome(self, item_id: int, *, wait: float = 0.0) -> Consumed | None:
        check_count("item_id", item_id, 1)
        check_seconds("wait", wait)
        await self._ready()

        async def consumed() -> Consumed | None:
            def look(connection: Connection) -> tuple[Any, ...] | None:
                return connection.execute(_OUTCOME, (item_id,)).fetchone()

            row = await self._on_connection(look, again=True)
            if row is None:
                raise LogError(f"{self._where}: no inbox item {item_id}")
            done, epoch, outcome = row
            return Consumed(item_id, epoch, outcome) if done else None

        found = await consumed()
        if found is not None or wait == 0:
            return found
        result: list[Consumed] = []

        async def check() -> bool:
            found = await consumed()
            if found is not None:
                result.append(found)
            return found is not None

        await self._waiters.wait(("c", item_id), 0, check, wait)
        return result[0] if result else None

    # -- waiting --------------------------------------------------------------------------

    async def wait_for_events(self, session_id: str, *, after: int, timeout: float) -> bool:
        check_session_id(session_id)
        check_count("after", after, 0)
        check_seconds("timeout", timeout)
        await self._ready()

        async def check() -> bool:
            return await self.last_seq(session_id) > after

        return await self._waiters.wait(("s", session_id), after, check, timeout)

    async def wait_for_inbox(self, timeout: float) -> bool:
        check_seconds("timeout", timeout)
        await self._ready_to_write()

        async def check() -> bool:
            return bool(await self.inbox())

        return await self._waiters.wait(("i", None), 0, check, timeout)


def is_postgres_url(name: str) -> bool:
    """Whether a log named on the command line (or in TURNKEEPER_LOG) is a PostgreSQL URL
    (`postgresql://...`) or libpq conninfo string (`host=... dbname=...`), not a path."""
    return _POSTGRES_NAME.match(name) is not None


def check_batch_seq(expected_seq: int) -> None:
    """Raise LogError unless `expected_seq` is an int >= 0 (for a write with no events)."""
    if isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 0:
        raise LogError(f"expected_seq must be an int >= 0, got {expected_seq!r}")


def _configure(connection: Connection) -> None:
    """Each pooled connection: its commits flushed before they return, whatever the
    server's default."""
    connection.execute("SET synchronous_commit = on")


def _as_bytes(line: bytes | str) -> bytes:
    return line.encode() if isinstance(line, str) else line


def _item(
    where: str,
    item_id: int,
    session_id: str,
    kind: str,
    payload: str,
    request_id: str | None,
    posted_at: float,
) -> InboxItem:
    try:
        value = _payload_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise LogCorrupt(f"{where}: inbox item {item_id}: payload is not JSON: {exc}") from None
    return InboxItem(item_id, session_id, kind, value, request_id, posted_at)
