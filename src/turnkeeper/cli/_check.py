"""`turnkeeper check LOG`: look for damage in a log, session by session.

For a SQLite log: SQLite's `integrity_check` of the file, each session's seq chain as the
events table holds it, held against what a read through the index returns, and a replay
of each session. For a JsonlLog directory or a `.jsonl` file: every line read, each
session's seq chain (and the order file's record of it) checked, and a replay of each.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import anyio
import msgspec

from turnkeeper.cli import _codes
from turnkeeper.cli._logs import _kind
from turnkeeper.cli._render import gist
from turnkeeper.core import InputError, LogCorrupt, LogError
from turnkeeper.events import Envelope
from turnkeeper.logs import (
    JsonlLog,
    PostgresLog,
    SqliteLog,
    StoredChain,
    check_sequence,
    is_postgres_url,
    read_jsonl,
)
from turnkeeper.state import replay

_PROBLEM = 100


class CheckOptions(msgspec.Struct, frozen=True):
    log: str


class _Row(msgspec.Struct, frozen=True):
    """One session's line in the table; `damaged` rows make the exit code 1."""

    session: str
    events: str
    status: str
    problem: str = ""
    damaged: bool = False


class _Report(msgspec.Struct):
    """What the check found: a row per session, damage to the log as a whole, and notes
    of what is not damage (a torn last line: a write cut short, never acknowledged)."""

    rows: list[_Row] = msgspec.field(default_factory=list)
    damage: list[str] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)

    def damaged(self) -> bool:
        return bool(self.damage) or any(row.damaged for row in self.rows)


def _said(error: LogError, path: Path) -> str:
    """The error's message without what the table already says: the log's path (its
    files' names stay), and the advice to run this command."""
    text = str(error).removeprefix(f"{path}: ").replace(f"{path}{os.sep}", "")
    for advice in (
        f" (a damaged file? see: turnkeeper check {path})",
        f" (a damaged log? see: turnkeeper check {path})",
        f"; see: turnkeeper check {path}",
    ):
        text = text.replace(advice, "")
    return text


def _replayed(session_id: str, events: Sequence[Envelope], path: Path) -> _Row:
    """The row of a session whose events read: its status once replayed, or why it does
    not replay."""
    try:
        state = replay(events)
    except LogError as exc:
        return _damaged(session_id, _said(exc, path), str(len(events)))
    return _Row(session_id, str(len(events)), state.status)


def _damaged(session_id: str, problem: str, events: str = "-") -> _Row:
    """The row of a damaged session; its problem without the session's name, which the
    row already says."""
    return _Row(
        session_id, events, "damaged", problem.removeprefix(f"session {session_id}: "), True
    )


async def _check_sqlite(path: Path, report: _Report) -> None:
    async with SqliteLog(path, read_only=True) as log:
        try:
            problems = await log.integrity_check()
        except LogCorrupt as exc:
            problems = [_said(exc, path)]
        report.damage += [f"integrity_check: {problem}" for problem in problems]
        try:
            chains: dict[str, StoredChain] | None = await log.stored_chains()
        except LogCorrupt as exc:
            report.damage.append(f"the events table does not read: {_said(exc, path)}")
            chains = None
        listed = await log.sessions()
        for session_id in listed:
            try:
                events = await log.read(session_id)
            except LogError as exc:
                report.rows.append(_damaged(session_id, _said(exc, path)))
                continue
            stored = None if chains is None else chains.get(session_id, StoredChain())
            if stored is not None and stored.problem is not None:
                report.rows.append(_damaged(session_id, f"in the events table: {stored.problem}"))
            elif stored is not None and stored.rows != len(events):
                found = len(events)
                held = f"the events table holds {stored.rows} rows of it, but a read finds {found}"
                report.rows.append(_damaged(session_id, held))
            else:
                report.rows.append(_replayed(session_id, events, path))
        known = set(listed)
        for session_id, stored in (chains or {}).items():
            if session_id not in known:
                unlisted = f"{stored.rows} rows in the events table, not in the sessions table"
                report.rows.append(_damaged(session_id, unlisted))


async def _check_directory(path: Path, report: _Report) -> None:
    async with JsonlLog(path, read_only=True) as log:
        for session_id in await log.sessions():
            try:
                events = await log.read(session_id)
            except LogError as exc:
                report.rows.append(_damaged(session_id, _said(exc, path)))
                continue
            row = _replayed(session_id, events, path)
            torn = log.torn.get(session_id)
            if torn is not None and not row.damaged:
                skipped = f"line {torn.line} skipped: a write cut short ({torn.error})"
                row = msgspec.structs.replace(row, problem=skipped)
            report.rows.append(row)


async def _check_postgres(url: str, report: _Report) -> None:
    """Every session of a fleet's database read and replayed (without becoming a worker);
    the store checks each page it reads (seqs in order, bodies the rows they are in)."""
    where = Path(url)
    async with PostgresLog(url, read_only=True) as log:
        for session_id in await log.sessions():
            try:
                events = await log.read(session_id)
            except LogError as exc:
                report.rows.append(_damaged(session_id, str(exc)))
                continue
            report.rows.append(_replayed(session_id, events, where))


async def _check_file(path: Path, report: _Report) -> None:
    read = await anyio.to_thread.run_sync(partial(read_jsonl, path, check_seq=False))
    sessions: dict[str, list[Envelope]] = {}
    for envelope in read.events:
        sessions.setdefault(envelope.session_id, []).append(envelope)
    for session_id, events in sessions.items():
        try:
            check_sequence(events)
        except LogError as exc:
            report.rows.append(_damaged(session_id, str(exc)))
        else:
            report.rows.append(_replayed(session_id, events, path))
    if read.torn is not None:
        report.notes.append(f"line {read.torn.line} skipped: a write cut short ({read.torn.error})")


def _print(report: _Report, name: str) -> None:
    """The table of sessions, then a line for the sessions' count and one for each damage
    and note the log as a whole has."""
    table = [("SESSION", "EVENTS", "STATUS", "PROBLEM")]
    table += [(r.session, r.events, r.status, gist(r.problem, _PROBLEM)) for r in report.rows]
    widths = [max(len(cells[column]) for cells in table) for column in range(3)]
    for cells in table:
        padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=False)]
        print("  ".join([*padded, cells[3]]).rstrip())
    damaged = sum(row.damaged for row in report.rows)
    sound = len(report.rows) - damaged
    count = len(report.rows)
    print(f"{name}: {count} session{'' if count == 1 else 's'}: {sound} sound, {damaged} damaged")
    for line in [*report.damage, *report.notes]:
        print(f"{name}: {line}")


async def check_command(options: CheckOptions) -> int:
    """Check the log at `options.log`; 0 if nothing is damaged, 1 if anything is."""
    if is_postgres_url(options.log):
        report = _Report()
        try:
            await _check_postgres(options.log, report)
        except LogCorrupt as exc:
            report.damage.append(f"cannot be read: {exc}")
        _print(report, "the database")
        return _codes.DAMAGED if report.damaged() else _codes.OK
    path = Path(options.log)
    kind = await anyio.to_thread.run_sync(_kind, path)
    if kind == "missing":
        raise InputError(f"{options.log}: no such log file")
    if kind == "empty":
        raise InputError(f"{options.log}: an empty file, not a log")
    report = _Report()
    check = {"sqlite": _check_sqlite, "directory": _check_directory, "jsonl": _check_file}[kind]
    try:
        await check(path, report)
    except LogCorrupt as exc:
        # Damage that keeps the log from opening, or the whole file from being read.
        report.damage.append(f"cannot be read: {_said(exc, path)}")
    _print(report, options.log)
    return _codes.DAMAGED if report.damaged() else _codes.OK
