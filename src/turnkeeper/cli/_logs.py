"""Logs named on the command line: a `.jsonl` file, a JsonlLog directory, or a SQLite file.

A path ending in `.jsonl` is one JSON Lines file (what `export` writes); an existing
directory is a JsonlLog (one file per session); anything else is a SQLite log.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import anyio
import msgspec

from turnkeeper.core import InputError, LogError
from turnkeeper.events import Envelope, encode_envelope
from turnkeeper.logs import (
    EventLog,
    JsonlLog,
    JsonlRead,
    PostgresLog,
    SeqConflict,
    SqliteLog,
    is_postgres_url,
    read_jsonl,
)


class LoadedLog(msgspec.Struct, frozen=True):
    """Every session of a log that reads, in the log's order; why each that does not read
    does not (a damaged row or file spoils its own session only); and a warning about a
    skipped torn line."""

    sessions: dict[str, tuple[Envelope, ...]]
    warning: str | None = None
    unreadable: dict[str, str] = msgspec.field(default_factory=dict)

    def session(self, session_id: str | None, path: str) -> tuple[str, tuple[Envelope, ...]]:
        """The session `session_id`, or the log's only session when it is None."""
        count = len(self.sessions) + len(self.unreadable)
        if session_id is None and count == 1:
            session_id = next(iter([*self.sessions, *self.unreadable]))
        if session_id is not None:
            if session_id in self.unreadable:
                raise LogError(self.unreadable[session_id])
            events = self.sessions.get(session_id)
            if events is None:
                raise InputError(f"--session: {path} holds no session {session_id!r}")
            return session_id, events
        if not count:
            raise InputError(f"{path}: the log holds no sessions")
        raise InputError(
            f"{path} holds {count} sessions: pick one with --session ID "
            f"(list them with: turnkeeper sessions --log {path})"
        )

    def every_session(self) -> list[tuple[Envelope, ...]]:
        """Every session's events; LogError naming the sessions that do not read."""
        if self.unreadable:
            named = "; ".join(f"{key}: {error}" for key, error in self.unreadable.items())
            raise LogError(f"sessions that do not read (pick others with --session): {named}")
        return list(self.sessions.values())


Kind = Literal["missing", "empty", "jsonl", "directory", "sqlite"]


def _kind(path: Path) -> Kind:
    if path.is_dir():
        return "directory"
    if not path.exists():
        return "missing"
    if path.suffix == ".jsonl":
        return "jsonl"
    # Opened as a log, an empty file would become one: a command that reads must not.
    return "sqlite" if path.stat().st_size else "empty"


def _open(path: Path, kind: Kind, *, read_only: bool = False) -> SqliteLog | JsonlLog:
    """The log at `path`; with `read_only`, one that takes no writer lock and never writes."""
    if kind == "directory":
        return JsonlLog(path, read_only=read_only)
    return SqliteLog(path, read_only=read_only)


async def _read_jsonl(path: Path) -> JsonlRead:
    try:
        return await anyio.to_thread.run_sync(read_jsonl, path)
    except LogError as exc:
        raise LogError(f"{path}: {exc}") from None


async def load_log(name: str) -> LoadedLog:
    """Read every session from the log at `name` (a path, or a PostgreSQL URL, read
    without becoming a worker); InputError if there is none there."""
    if is_postgres_url(name):
        return await _load_from(PostgresLog(name, read_only=True))
    path = Path(name)
    kind = await anyio.to_thread.run_sync(_kind, path)
    if kind == "missing":
        raise InputError(f"{name}: no such log file")
    if kind == "empty":
        raise InputError(f"{name}: an empty file, not a log")
    if kind == "jsonl":
        read = await _read_jsonl(path)
        sessions: dict[str, list[Envelope]] = {}
        for envelope in read.events:
            sessions.setdefault(envelope.session_id, []).append(envelope)
        warning = None
        if read.torn is not None:
            torn = read.torn
            warning = f"{name}: skipped the unfinished last line {torn.line} ({torn.error})"
        return LoadedLog({key: tuple(events) for key, events in sessions.items()}, warning)
    return await _load_from(_open(path, kind, read_only=True))


async def _load_from(opened: EventLog) -> LoadedLog:
    loaded: dict[str, tuple[Envelope, ...]] = {}
    unreadable: dict[str, str] = {}
    async with opened as log:
        for key in await log.sessions():
            try:
                loaded[key] = tuple(await log.read(key))
            except LogError as exc:
                unreadable[key] = str(exc)
        if isinstance(log, SqliteLog):
            # Rows of a session the sessions table does not list (its row deleted): no
            # read sees them, and leaving them out would lose the session without a word.
            for key, chain in (await log.stored_chains()).items():
                if key not in loaded and key not in unreadable:
                    unreadable[key] = (
                        f"{log.path}: session {key}: its {chain.rows} rows are in the events "
                        f"table, but the sessions table does not list it (see: turnkeeper "
                        f"check {log.path})"
                    )
    return LoadedLog(loaded, unreadable=unreadable)


def _append_line(path: Path, line: bytes) -> None:
    with path.open("ab") as file:
        file.write(line)
        file.flush()
        os.fsync(file.fileno())


async def append_session(name: str, events: Sequence[Envelope]) -> None:
    """Append a new session's `events` (from seq 1) to the log at `name`, in one write:
    InputError if the log holds a session of that id, LogError if another process
    writes the log."""
    session_id = events[0].session_id
    if is_postgres_url(name):
        raise InputError(
            f"{name}: a fleet's log is written by its workers: fork through one of them "
            f"(POST /v1/sessions/{{id}}/fork)"
        )
    path = Path(name)
    kind = await anyio.to_thread.run_sync(_kind, path)
    if kind == "jsonl":
        read = await _read_jsonl(path)
        if read.torn is not None:
            raise InputError(
                f"{name}: line {read.torn.line} is unfinished (a write was cut short); move "
                "the file aside or repair it first"
            )
        if any(envelope.session_id == session_id for envelope in read.events):
            raise InputError(f"--new-id: {name} holds a session {session_id} already")
        data = b"".join(encode_envelope(envelope) + b"\n" for envelope in events)
        await anyio.to_thread.run_sync(_append_line, path, data)
        return
    async with _open(path, kind) as log:
        if not log.writable:
            raise LogError(
                f"{name}: this log is not written here: {log.read_only_because}; if a "
                "turnkeeper process serves it, fork through it (POST /v1/sessions/{id}/fork)"
            )
        try:
            await log.append(events, expected_seq=0)
        except SeqConflict:
            raise InputError(f"--new-id: {name} holds a session {session_id} already") from None


class Recorder:
    """Appends one session's events to a log as they happen, each durable before the next."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._path = Path(name)
        self._log: EventLog | None = None

    async def __aenter__(self) -> Self:
        kind = await anyio.to_thread.run_sync(_kind, self._path)
        if self._path.suffix == ".jsonl" and kind != "directory":
            if kind == "missing":
                # Made with its folders, as a SQLite log's file is.
                try:
                    await anyio.Path(self._path.parent).mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise LogError(f"--log {self.name}: cannot make its folder: {exc}") from None
            if kind == "jsonl":
                read = await _read_jsonl(self._path)
                if read.torn is not None:
                    raise InputError(
                        f"--log {self.name}: line {read.torn.line} is unfinished (a write was "
                        "cut short); move the file aside or repair it first"
                    )
        else:
            log = await _open(self._path, kind).__aenter__()
            if not log.writable:
                await log.close()
                raise LogError(
                    f"--log {self.name}: this log is not written here: "
                    f"{log.read_only_because}; pick another log"
                )
            self._log = log
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._log is not None:
            await self._log.close()

    async def record(self, envelope: Envelope) -> None:
        """Append `envelope` (the session's next event)."""
        if self._log is not None:
            await self._log.append([envelope], expected_seq=envelope.seq - 1)
        else:
            line = encode_envelope(envelope) + b"\n"
            await anyio.to_thread.run_sync(_append_line, self._path, line)
