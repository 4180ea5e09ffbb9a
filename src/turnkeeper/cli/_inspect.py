"""`turnkeeper replay`, `sessions` and `export`: reading logged sessions, no model calls."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import anyio
import msgspec

from turnkeeper.cli import _codes
from turnkeeper.cli._guards import parse_guards
from turnkeeper.cli._logs import LoadedLog, load_log
from turnkeeper.cli._render import answer_of, gist, history_lines, outcome_lines, step_line
from turnkeeper.core import InputError, LogError
from turnkeeper.events import Envelope, SessionOpened
from turnkeeper.logs import encode_jsonl
from turnkeeper.sessions import recheck
from turnkeeper.state import replay


class ReplayOptions(msgspec.Struct, frozen=True):
    log: str
    session: str | None
    guards: str | None


class SessionsOptions(msgspec.Struct, frozen=True):
    log: str
    session: str | None


class ExportOptions(msgspec.Struct, frozen=True):
    log: str
    session: str | None
    output: str | None


def _print(lines: Iterable[str]) -> None:
    for line in lines:
        print(line)


async def _load(path: str) -> LoadedLog:
    log = await load_log(path)
    if log.warning is not None:
        print(f"turnkeeper: warning: {log.warning}", file=sys.stderr)
    return log


async def replay_command(options: ReplayOptions) -> int:
    """Print the session's history and outcome; with `--guards`, where it would differ."""
    changes = parse_guards(options.guards) if options.guards is not None else None
    log = await _load(options.log)
    session_id, events = log.session(options.session, options.log)
    state = replay(events)
    print(f"session {session_id}: {len(events)} events, model {state.model}")
    _print(history_lines(state.history))
    _print(outcome_lines(state))
    if changes is None:
        return _codes.OK
    opened = events[0].event
    assert isinstance(opened, SessionOpened)  # replay checked it
    divergence = recheck(events, guards=changes.over(opened.guards))
    if divergence is None:
        print("under the given guards: the same outcome at every poll")
        return _codes.OK
    print(f"under the given guards: {divergence.summary}")
    return _codes.STOPPED


def _summary(events: tuple[Envelope, ...]) -> tuple[str, str, str]:
    """Status, model calls and last text of a session, or why it cannot be rebuilt."""
    try:
        state = replay(events)
    except LogError as exc:
        return "unreadable", "-", gist(str(exc), 80)
    return state.status, str(state.polls), gist(answer_of(state), 80)


async def sessions_command(options: SessionsOptions) -> int:
    """List the log's sessions, or show one: its history, outcome and events."""
    log = await _load(options.log)
    if options.session is None:
        rows = [("ID", "STATUS", "POLLS", "LAST")]
        rows += [(key, *_summary(events)) for key, events in log.sessions.items()]
        rows += [(key, "unreadable", "-", gist(error, 80)) for key, error in log.unreadable.items()]
        widths = [max(len(row[column]) for row in rows) for column in range(3)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            print("  ".join([*cells, row[3]]).rstrip())
        return _codes.OK
    session_id, events = log.session(options.session, options.log)
    state = replay(events)
    print(f"session {session_id}: {len(events)} events, model {state.model}")
    print("history:")
    _print(f"  {line}" for line in history_lines(state.history))
    _print(outcome_lines(state))
    print("events:")
    for envelope in events:
        line = step_line(envelope)
        print(f"  {envelope.seq:>4} {envelope.type}" + (f"  {line}" if line else ""))
    return _codes.OK


def _overwrites(output: Path, log: Path) -> bool:
    """Whether writing `output` would write over the log at `log` or a file of it: the
    file itself, a file in its directory (a JsonlLog), or one SQLite keeps beside it
    (`-wal`, `-shm`, the writer lock)."""
    output, log = output.resolve(), log.resolve()
    return (
        output == log
        or log in output.parents
        or (output.parent == log.parent and output.name.startswith(log.name + "-"))
    )


async def export_command(options: ExportOptions) -> int:
    """Write the session (or every session) as JSON Lines to `--output` or stdout."""
    if options.output is not None and _overwrites(Path(options.output), Path(options.log)):
        raise InputError(
            f"--output: {options.output} is the log {options.log} or one of its files; "
            "export writes a new file"
        )
    log = await _load(options.log)
    if options.session is None:
        chosen: Iterable[tuple[Envelope, ...]] = log.every_session()
    else:
        chosen = [log.session(options.session, options.log)[1]]
    data = encode_jsonl(envelope for events in chosen for envelope in events)
    if options.output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        await anyio.Path(Path(options.output)).write_bytes(data)
    return _codes.OK
