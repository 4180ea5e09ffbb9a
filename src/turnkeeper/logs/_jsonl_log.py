"""An event log in a directory of JSON Lines files, one `<session_id>.jsonl` per session."""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import time
from pathlib import Path

import anyio
import msgspec
import structlog

from turnkeeper.core import LogCorrupt, LogError, SeqError, gc_paused
from turnkeeper.events import Envelope
from turnkeeper.logs._jsonl import TornTail, decode_jsonl
from turnkeeper.logs._log import Batch, EventLog, SeqConflict
from turnkeeper.logs._memory_log import EventStore

_logger = structlog.get_logger(__name__)

# Session ids become file names: no separators, no leading dot, nothing to escape the directory.
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_SUFFIX = ".jsonl"
_ORDER = "order.idx"
_LOCK = "writer.lock"
_LOCK_TRIES = 5


class _Tail(msgspec.Struct, frozen=True):
    """Where a session file's good lines end, and whether the last one lacks its newline."""

    size: int
    missing_newline: bool = False


class _SessionFile(msgspec.Struct, frozen=True):
    session_id: str
    events: tuple[Envelope, ...]
    tail: _Tail
    torn: TornTail | None


class _Directory(msgspec.Struct, frozen=True):
    """What a log directory held: its session files, the order file's entries, why each
    session that does not read does not, and the last seq the order file records of each
    of those."""

    files: tuple[_SessionFile, ...]
    order: tuple[tuple[str, int], ...]
    order_clean: bool
    damaged: dict[str, LogError]
    damaged_records: dict[str, int]


class _Lock(msgspec.Struct, frozen=True):
    """The directory's writer lock as `_lock` found it: its descriptor (None for a log
    that only reads, and then why it does), and whether another log holds it."""

    fd: int | None
    live_writer: bool
    read_only_because: str = ""


class JsonlLog(EventLog):
    """An event log in `directory`: one JSON Lines file per session, each line an envelope.

    An append writes its lines and fsyncs the file (and, for a new session, the
    directory) before it returns. It is not all-or-nothing across a crash, as a
    SqliteLog's is: a process killed in the middle of one may leave the first of its
    lines, which read back as logged (each a whole event, in order). Appends to
    different sessions run in parallel worker threads; there is no group commit across
    files. One log writes a directory at a time: opening one takes a lock on
    `writer.lock` in it, and a log opened while another holds it only reads (its
    appends raise LogError), so two writers cannot cut each other's lines. A log opened
    `read_only` never takes the lock, so a reader (a tailer, the command line) cannot
    keep a writer that starts at the same moment from writing. The log holds every
    event in memory once open.

    A torn last line (a write cut short by a crash) is reported, in `torn` and as a
    warning, and skipped; the file is cut back to its last good line before the
    session's next append. Any other bad line, an event of another session, a gap or
    repeat in the seqs, or fewer events than the order file (below) records of the
    session (a file cut short, or gone) damages that session alone: reading it,
    appending to it and `read_all` raise LogCorrupt or SeqError naming the file and
    session (as reading a damaged row does in a SqliteLog), while the other sessions read
    and append as ever. The order file keeps what it records of a damaged session, so the
    damage is found again at the next open. A directory this process cannot write opens
    for reading only, as a file SQLite opens read-only does.

    Positions: the file `order.idx` records the global order, one line
    `<session_id> <seq>` per append ("that session's events up to seq come next").
    It is written after the session file is fsynced, but not itself fsynced, so
    positions are exactly stable across restarts and process crashes. Events it does
    not place (their entry lost to an OS crash, or session files copied in) follow
    the placed ones in (time, session id, seq) order, where an event's time is the
    latest `at` of its session so far; a writer rewrites the file to match when it
    opens. A log opened beside a live writer holds what the order file placed when it
    opened, and nothing the writer was still appending: a prefix of the writer's
    order, so its positions are the writer's and a reader can tail the directory by
    opening a new log and calling `read_all(after=...)` with the last position seen.
    """

    def __init__(self, directory: str | os.PathLike[str], *, read_only: bool = False) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.read_only = read_only
        self.torn: dict[str, TornTail] = {}
        self.commits = 0
        self._store = EventStore()
        self._tails: dict[str, _Tail] = {}
        self._busy: dict[str, anyio.Event] = {}
        self._in_flight = 0
        self._idle: anyio.Event | None = None
        self._order_fd: int | None = None
        self._order_stale = False
        self._damaged: dict[str, LogError] = {}
        self._damaged_records: dict[str, int] = {}
        self._lock_fd: int | None = None
        self._read_only_because = ""

    @property
    def read_only_because(self) -> str:
        """Why the open log does not write its directory ("" while it does, and before it
        opens): it was opened `read_only`, another log writes it, or the directory or its
        writer lock cannot be written here."""
        return self._read_only_because

    def __repr__(self) -> str:
        suffix = ", read_only=True" if self.read_only else ""
        return f"JsonlLog({str(self.directory)!r}{suffix})"

    async def _open(self) -> None:
        # Locked before it is read: what a writer reads, no other writer changes.
        lock = await anyio.to_thread.run_sync(_lock, self.directory, self.read_only)
        self._lock_fd, live_writer = lock.fd, lock.live_writer
        self._read_only_because = lock.read_only_because
        try:
            directory = await anyio.to_thread.run_sync(_load_directory, self.directory)
            self._damaged_records = directory.damaged_records
            events, exact = _arrange(
                directory.files, directory.order, directory.damaged, placed_only=live_writer
            )
            if self._lock_fd is not None and not (exact and directory.order_clean):
                # Rewritten now, not at the first append: a reader beside this log trusts it.
                await anyio.to_thread.run_sync(self._rewrite_order, events)
        except BaseException:
            # A failed or cancelled open leaves the directory to the next log that opens it.
            self._unlock()
            raise
        self._damaged = directory.damaged
        for session_id, error in directory.damaged.items():
            _logger.error("jsonl log: session unreadable", session_id=session_id, error=str(error))
        for file in directory.files:
            self._tails[file.session_id] = file.tail
            # Beside a live writer, a torn last line is most likely an append in progress.
            if file.torn is not None and not live_writer:
                self.torn[file.session_id] = file.torn
                _logger.warning(
                    "jsonl log: torn last line skipped",
                    path=str(self._path(file.session_id)),
                    session_id=file.session_id,
                    line=file.torn.line,
                    error=file.torn.error,
                )
        self._store.add(events)

    async def _close(self) -> None:
        while self._in_flight:
            self._idle = anyio.Event()
            await self._idle.wait()
        if self._order_fd is not None:
            os.close(self._order_fd)
            self._order_fd = None
        self._unlock()

    def _writes(self) -> bool:
        return self._lock_fd is not None

    def _unlock(self) -> None:
        """Release the directory's writer lock if this log holds it."""
        if self._lock_fd is not None:
            # Released, not only closed: a child forked meanwhile shares the descriptor,
            # and would hold the lock until it exits.
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _append(self, batch: Batch) -> None:
        session_id = batch.session_id
        if not _SESSION_ID.fullmatch(session_id):
            raise LogError(
                f"session id {session_id!r} cannot name a log file: use at most 200 letters, "
                "digits, '.', '_' or '-', starting with a letter or digit"
            )
        if self._lock_fd is None:
            raise LogError(
                f"{self.directory}: this log only reads the directory: {self._read_only_because}"
            )
        self._check_readable(session_id)
        self._in_flight += 1
        try:
            await self._append_in_turn(batch)
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._idle is not None:
                self._idle.set()

    async def _append_in_turn(self, batch: Batch) -> None:
        """Append once no other append of the session is in progress."""
        session_id = batch.session_id
        while (busy := self._busy.get(session_id)) is not None:
            await busy.wait()
        actual = self._store.last_seq(session_id)
        if actual != batch.expected_seq:
            raise SeqConflict(session_id, batch.expected_seq, actual)
        done = self._busy[session_id] = anyio.Event()
        try:
            tail = self._tails.get(session_id, _Tail(0))
            data = b"".join(line + b"\n" for line in batch.lines)
            # Once bytes may be on disk, memory must follow them, even if the caller is cancelled.
            with anyio.CancelScope(shield=True):
                try:
                    written = await anyio.to_thread.run_sync(
                        _write, self._path(session_id), data, tail, actual == 0
                    )
                except LogCorrupt as exc:
                    # The session is damaged from now on, as if found so at the open.
                    self._damaged[session_id] = exc
                    raise
                self._record_order(session_id, batch.events[-1].seq)
                self._tails[session_id] = _Tail(tail.size + written)
                self._store.add(batch.events)
                self.commits += 1
        finally:
            del self._busy[session_id]
            done.set()

    async def _read(self, session_id: str, after: int, limit: int | None) -> list[Envelope]:
        self._check_readable(session_id)
        return self._store.read(session_id, after, limit)

    async def _last_seq(self, session_id: str) -> int:
        self._check_readable(session_id)
        return self._store.last_seq(session_id)

    async def _sessions(self) -> list[str]:
        # A damaged session is one all the same; where it was created is not known.
        listed = self._store.sessions()
        return listed + sorted(set(self._damaged).difference(listed))

    async def _read_all(self, after: int, limit: int | None) -> list[tuple[int, Envelope]]:
        # Where a damaged session's events fall among the others is not known.
        for session_id in self._damaged:
            self._check_readable(session_id)
        return self._store.read_all(after, limit)

    def _check_readable(self, session_id: str) -> None:
        """Raise what damages the session's file, if anything does."""
        error = self._damaged.get(session_id)
        if error is not None:
            raise error.with_traceback(None)

    def _path(self, session_id: str) -> Path:
        return self.directory / f"{session_id}{_SUFFIX}"

    def _rewrite_order(self, events: list[Envelope]) -> None:
        """Make the order file place `events` (every event, in global order); if that
        fails, say so and leave it to the next append to try again."""
        if self._order_fd is not None:
            os.close(self._order_fd)
            self._order_fd = None
        path = self.directory / _ORDER
        try:
            _replace_order(path, events, self._damaged_records)
        except OSError as exc:
            self._order_stale = True
            _logger.warning(
                "jsonl log: cannot rewrite the order file", path=str(path), error=str(exc)
            )
        else:
            self._order_stale = False

    def _record_order(self, session_id: str, seq: int) -> None:
        """Note in the order file that the session's events up to `seq` come next.

        This runs on the event loop, between a session file's fsync and the events
        joining the store, so the file's order is the store's order. It is a small
        write to the page cache (no fsync). If it fails, the events are logged all the
        same (the session file holds them): the order file is rewritten from the store
        at the next append, and until then a reader beside this log does not see them.
        """
        if self._order_stale:
            self._rewrite_order([envelope for _, envelope in self._store.read_all(0, None)])
            if self._order_stale:
                return
        path = self.directory / _ORDER
        try:
            if self._order_fd is None:
                self._order_fd = os.open(
                    path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
                )
            os.write(self._order_fd, f"{session_id} {seq}\n".encode())
        except OSError as exc:
            self._order_stale = True
            _logger.warning(
                "jsonl log: cannot record the order of an append", path=str(path), error=str(exc)
            )


def _lock(directory: Path, read_only: bool) -> _Lock:
    """Take the directory's writer lock (creating the directory if it is missing), unless
    `read_only`.

    The lock's descriptor is None if this log only reads: it is `read_only`, another log
    holds the lock, or the lock cannot be taken or the directory written here (a
    read-only directory). `live_writer` says whether another log holds it, that is,
    whether a live writer may be appending while this one reads.
    """
    path = directory / _LOCK
    if read_only:
        if not directory.is_dir():
            raise LogError(f"{directory}: no log directory there")
        return _Lock(None, _held(path), "it was opened read_only")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LogError(f"{directory}: cannot open the log directory: {exc}") from None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        return _Lock(None, _held(path), f"cannot open its writer lock: {exc}")
    # A few tries: a read_only log looking at the lock holds it for a moment (see `_held`).
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if attempt + 1 < _LOCK_TRIES:
                time.sleep(0.01)
        else:
            break
    else:
        os.close(fd)
        return _Lock(None, True, f"another log writes it (it holds the writer lock {path})")
    # Its lock file may be writable where the directory is not (no session file could be
    # made there): this process, not the file's mode, decides.
    if not os.access(directory, os.W_OK | os.X_OK):
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        return _Lock(None, False, "the directory is read-only here")
    return _Lock(fd, False)


def _held(path: Path) -> bool:
    """Whether a log holds the lock file this process cannot open for writing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        # No lock file: no log has ever written here.
        return False
    try:
        # A shared lock, dropped at once: it fails only while a writer holds the lock.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _load_directory(directory: Path) -> _Directory:
    """Read every session file and the order file (of a directory `_lock` has made sure of)."""
    try:
        paths = sorted(path for path in directory.iterdir() if path.name.endswith(_SUFFIX))
    except OSError as exc:
        raise LogError(f"{directory}: cannot open the log directory: {exc}") from None
    files, damaged = _load_files(paths)
    # Read after the session files: a writer records an append's order after its lines,
    # so every event this order file places is in the files read (see `_arrange`), or
    # was appended since they were read.
    order, clean = _load_order(directory / _ORDER)
    recorded: dict[str, int] = {}
    for session_id, seq in order:
        recorded[session_id] = max(seq, recorded.get(session_id, 0))
    files = _check_recorded(directory, files, recorded, damaged)
    damaged_records = {key: recorded[key] for key in damaged if key in recorded}
    return _Directory(files, order, clean, damaged, damaged_records)


def _check_recorded(
    directory: Path,
    files: tuple[_SessionFile, ...],
    recorded: dict[str, int],
    damaged: dict[str, LogError],
) -> tuple[_SessionFile, ...]:
    """The session files that hold at least the events the order file records of their
    session, read again if they did not: a writer fsyncs an append's lines before it
    records them, so a file that still holds fewer (or is gone) is damaged, and `damaged`
    gets why. A file that now holds enough has grown since it was read (a live writer)."""
    held = {file.session_id: file for file in files}
    for session_id, seq in recorded.items():
        file = held.get(session_id)
        if session_id in damaged or (file is not None and len(file.events) >= seq):
            continue
        path = directory / f"{session_id}{_SUFFIX}"
        try:
            file = _load_file(path, session_id) if path.exists() else None
        except LogError as exc:
            file, damaged[session_id] = None, exc
        else:
            if file is None or len(file.events) < seq:
                has = "is missing" if file is None else f"holds {len(file.events)} events"
                damaged[session_id] = LogCorrupt(
                    f"{path} (session {session_id}) {has}, but the order file records seq "
                    f"{seq} of it (a damaged log? see: turnkeeper check {directory})"
                )
        if session_id in damaged:
            held.pop(session_id, None)
        elif file is not None:
            held[session_id] = file
    return tuple(held.values())


def _load_files(paths: list[Path]) -> tuple[tuple[_SessionFile, ...], dict[str, LogError]]:
    """The session files that read, and why each that does not read does not; in one
    pause of the cycle collector (see `gc_paused`)."""
    files: list[_SessionFile] = []
    damaged: dict[str, LogError] = {}
    with gc_paused():
        for path in paths:
            session_id = path.name.removesuffix(_SUFFIX)
            if not _SESSION_ID.fullmatch(session_id):
                raise LogCorrupt(f"{path}: not a session log (the name is not a valid session id)")
            try:
                files.append(_load_file(path, session_id))
            except LogError as exc:
                damaged[session_id] = exc
    return tuple(files), damaged


def _load_order(path: Path) -> tuple[tuple[tuple[str, int], ...], bool]:
    """The order file's entries, and whether it ended cleanly (a torn last entry is dropped)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return (), True
    except OSError as exc:
        raise LogError(f"{path}: cannot read: {exc}") from None
    lines = data.split(b"\n")
    torn = lines.pop()
    entries: list[tuple[str, int]] = []
    for number, line in enumerate(lines, start=1):
        fields = line.split(b" ")
        session_id = fields[0].decode("utf-8", "replace")
        if len(fields) != 2 or not _SESSION_ID.fullmatch(session_id) or not fields[1].isdigit():
            raise LogCorrupt(f"{path}: not an order entry ('<session_id> <seq>')", line=number)
        entries.append((session_id, int(fields[1])))
    return tuple(entries), torn == b""


def _arrange(
    files: tuple[_SessionFile, ...],
    order: tuple[tuple[str, int], ...],
    damaged: dict[str, LogError],
    *,
    placed_only: bool,
) -> tuple[list[Envelope], bool]:
    """Every event in global order, and whether the order file placed exactly all of them.

    The files hold every event the order file places (see `_check_recorded`), except
    those of `damaged` sessions, whose entries place nothing. With `placed_only` (a live
    writer may be appending), only the events the order file places: the files may hold
    more, appended since, and one of those may yet come before an event the order file
    will place next. What is left is a prefix of the writer's order, so positions agree.
    """
    sessions = {file.session_id: file.events for file in files}
    placed: dict[str, int] = {}
    arranged: list[Envelope] = []
    exact = True
    for session_id, seq in order:
        if session_id in damaged:
            continue
        start = placed.get(session_id, 0)
        if seq <= start:
            # An entry that places nothing new (one written twice, say).
            exact = False
            continue
        arranged.extend(sessions[session_id][start:seq])
        placed[session_id] = seq
    if placed_only:
        return arranged, False
    ranked: list[tuple[float, str, int, Envelope]] = []
    for session_id, events in sessions.items():
        first = placed.get(session_id, 0)
        if first == len(events):
            continue
        time = -math.inf
        for envelope in events:
            time = max(time, envelope.at)
            if envelope.seq > first:
                ranked.append((time, session_id, envelope.seq, envelope))
    ranked.sort(key=lambda item: item[:3])
    arranged.extend(item[3] for item in ranked)
    return arranged, exact and not ranked


def _replace_order(path: Path, events: list[Envelope], damaged_records: dict[str, int]) -> None:
    """Replace the order file with one that places `events` (every event, in global order)
    and ends with what it records of each damaged session, which places nothing."""
    lines: list[bytes] = []
    for index, envelope in enumerate(events):
        following = events[index + 1].session_id if index + 1 < len(events) else None
        if following != envelope.session_id:
            lines.append(f"{envelope.session_id} {envelope.seq}\n".encode())
    lines += [f"{session_id} {seq}\n".encode() for session_id, seq in damaged_records.items()]
    temporary = path.with_name(f"{_ORDER}.tmp")
    temporary.write_bytes(b"".join(lines))
    temporary.replace(path)


def _load_file(path: Path, session_id: str) -> _SessionFile:
    """One session file's events; a torn last line is skipped and reported."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LogError(f"{path}: cannot read: {exc}") from None
    try:
        read = decode_jsonl(data, check_seq=False)
    except LogCorrupt as exc:
        after = _last_good_seq(data, exc.line)
        error = LogCorrupt(f"{path} (session {session_id}), {exc} (after seq {after})")
        error.line = exc.line
        raise error from None
    events = read.events
    # Checked in one pass over each field (in comprehensions, whose attribute reads Python
    # specialises); a file that fails is walked to name its event.
    if [envelope.session_id for envelope in events].count(session_id) != len(events) or [
        envelope.seq for envelope in events
    ] != list(range(1, len(events) + 1)):
        _check_file(path, session_id, events)
    if read.torn is not None:
        tail = _Tail(data.rfind(b"\n") + 1)
    else:
        tail = _Tail(len(data), missing_newline=bool(data) and not data.endswith(b"\n"))
    return _SessionFile(session_id, read.events, tail, read.torn)


def _check_file(path: Path, session_id: str, events: tuple[Envelope, ...]) -> None:
    """Raise LogCorrupt or SeqError at the first event that is not the session's next."""
    for expected, envelope in enumerate(events, start=1):
        if envelope.session_id != session_id:
            raise LogCorrupt(
                f"{path} (session {session_id}): seq {envelope.seq} belongs to session "
                f"{envelope.session_id!r}"
            )
        if envelope.seq != expected:
            gap = SeqError(session_id, envelope.seq, expected)
            gap.args = (f"{path}: {gap}",)
            raise gap


def _last_good_seq(data: bytes, bad_line: int | None) -> int:
    """The seq on the last line that decodes before `bad_line` (0 if none)."""
    if bad_line is None:
        return 0
    good = b"\n".join(data.split(b"\n")[: bad_line - 1]) + b"\n"
    events = decode_jsonl(good, check_seq=False).events
    return events[-1].seq if events else 0


def _write(path: Path, data: bytes, tail: _Tail, new_session: bool) -> int:
    """Append `data` after the file's good lines and fsync; return the bytes written."""
    if tail.missing_newline:
        data = b"\n" + data
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < tail.size:
                # Cut short, replaced or removed (and made again here) while the log was
                # open: padded back to its length, the lost lines would read as damage
                # only once this append had been acknowledged.
                raise LogCorrupt(
                    f"{path}: holds {size} bytes, fewer than the {tail.size} this log wrote "
                    "to it (cut short, replaced or removed while the log was open)"
                )
            if size != tail.size:
                # A torn last line, or the rest of an earlier append that failed.
                os.ftruncate(fd, tail.size)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError:
                # A full disk, say: what did go in must not read back as logged after a
                # restart. (If this fails too, the next append cuts it off.)
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, tail.size)
                    os.fsync(fd)
                raise
        finally:
            os.close(fd)
        if new_session:
            # The file's directory entry must be durable too.
            directory = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
    except OSError as exc:
        raise LogError(f"{path}: cannot append: {exc}") from None
    return len(data)
