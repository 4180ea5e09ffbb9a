"""`turnkeeper check LOG`, run as a subprocess on real logs: clean, torn and byte-damaged
SQLite files and JSONL directories."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import anyio
import pytest

from tests.cli.test_main import Done, cli
from tests.logs.test_sqlite_log import damage_index_entry, damage_page_header
from turnkeeper.core import AgentSpec, ToolSpec
from turnkeeper.events import Envelope, encode_envelope
from turnkeeper.logs import EventLog, JsonlLog, SqliteLog, encode_jsonl
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import run

SPEC = AgentSpec(system_prompt="Look things up.", tools=(ToolSpec("lookup"),))
# The damage report's log: 20 sessions of 15 events (three lookups and an answer) each.
NAMES = [f"session-{index:03d}" for index in range(20)]


async def lookup(key: str) -> str:
    return f"value of {key}"


async def session(session_id: str) -> list[Envelope]:
    """A finished session of 15 events: three tool round trips and an answer."""
    script = [tool_response(("lookup", {"key": f"{session_id} {step}"})) for step in range(3)]
    chat = ScriptedChat([*script, text_response(f"{session_id} done")])
    result = await run(SPEC, "Look it up.", chat, tools={"lookup": lookup}, session_id=session_id)
    assert len(result.events) == 15
    return list(result.events)


async def record(log: EventLog, names: list[str]) -> dict[str, list[Envelope]]:
    sessions = {name: await session(name) for name in names}
    async with log:
        for events in sessions.values():
            await log.append(events, expected_seq=0)
    return sessions


def table(done: Done) -> dict[str, list[str]]:
    """The printed table, by session: its events, status and problem."""
    lines = done.out.splitlines()
    assert lines[0].split() == ["SESSION", "EVENTS", "STATUS", "PROBLEM"]
    rows = {}
    for line in lines[1:]:
        if line.startswith("session-"):
            name, events, status, *problem = line.split(maxsplit=3)
            rows[name] = [events, status, *problem]
    return rows


def summary(done: Done) -> list[str]:
    """The lines after the table."""
    return [line for line in done.out.splitlines()[1:] if not line.startswith("session-")]


def test_a_clean_sqlite_log_checks_sound(tmp_path: Path) -> None:
    anyio.run(record, SqliteLog(tmp_path / "log.db"), NAMES)
    done = cli("check", "log.db", cwd=tmp_path)
    assert (done.code, done.err) == (0, "")
    assert table(done) == {name: ["15", "idle"] for name in NAMES}
    assert summary(done) == ["log.db: 20 sessions: 20 sound, 0 damaged"]


def test_a_clean_jsonl_log_checks_sound(tmp_path: Path) -> None:
    anyio.run(record, JsonlLog(tmp_path / "log"), NAMES[:3])
    done = cli("check", "log", cwd=tmp_path)
    assert (done.code, done.err) == (0, "")
    assert table(done) == {name: ["15", "idle"] for name in NAMES[:3]}
    assert summary(done) == ["log: 3 sessions: 3 sound, 0 damaged"]


def test_an_index_entry_damaged_in_a_sqlite_file_is_found(tmp_path: Path) -> None:
    # The damage report's case: session-013 read back as 3 events of 15, with no error.
    anyio.run(record, SqliteLog(tmp_path / "log.db"), NAMES)
    damage_index_entry(tmp_path / "log.db", "session-013", 4)
    done = cli("check", "log.db", cwd=tmp_path)
    assert done.code == 1
    rows = table(done)
    assert rows.pop("session-013") == [
        "-",
        "damaged",
        "the read stops at seq 3, but its last event is seq 15",
    ]
    assert rows == {name: ["15", "idle"] for name in NAMES if name != "session-013"}
    assert summary(done) == [
        "log.db: 20 sessions: 19 sound, 1 damaged",
        "log.db: integrity_check: row 199 missing from index sqlite_autoindex_events_1",
    ]


def test_damage_a_read_cannot_see_is_found_in_the_table_itself(tmp_path: Path) -> None:
    anyio.run(record, SqliteLog(tmp_path / "log.db"), NAMES)
    damage_index_entry(tmp_path / "log.db", "session-007", 15)
    done = cli("check", "log.db", cwd=tmp_path)
    assert done.code == 1
    rows = table(done)
    # The last event's index entry, damaged: a read and the session's last seq agree on 14;
    # the table holds the 15th.
    assert rows.pop("session-007") == [
        "-",
        "damaged",
        "the events table holds 15 rows of it, but a read finds 14",
    ]
    # The entry, out of its place, leads the next session's read astray.
    assert rows.pop("session-008") == [
        "-",
        "damaged",
        "the read stops at seq 0, but its last event is seq 15",
    ]
    assert rows == {name: ["15", "idle"] for name in NAMES[9:] + NAMES[:7]}
    assert summary(done) == [
        "log.db: 20 sessions: 18 sound, 2 damaged",
        "log.db: integrity_check: row 120 missing from index sqlite_autoindex_events_1",
        "log.db: integrity_check: row 121 missing from index sqlite_autoindex_events_1",
    ]


def test_a_sqlite_file_quick_check_finds_damaged_is_checked_whole(tmp_path: Path) -> None:
    anyio.run(record, SqliteLog(tmp_path / "log.db"), NAMES[:2])
    damage_page_header(tmp_path / "log.db", "sessions")
    done = cli("check", "log.db", cwd=tmp_path)
    assert done.code == 1
    assert table(done) == {name: ["15", "idle"] for name in NAMES[:2]}
    counted, found = summary(done)
    assert counted == "log.db: 2 sessions: 2 sound, 0 damaged"
    # The sessions table's root page: its header's free space is wrong.
    assert found.startswith("log.db: integrity_check: ")
    assert "page 2" in found.lower()
    assert "sqlite log: damaged file" in done.err


def test_a_torn_sqlite_commit_leaves_the_log_as_it_was_before_it(tmp_path: Path) -> None:
    # A copy of the file taken as a commit was being written: its -wal file ends in the
    # middle of the commit's last frame.
    path = tmp_path / "log.db"
    sessions = anyio.run(record, SqliteLog(path), NAMES[:2])
    more = anyio.run(session, "session-002")
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA wal_autocheckpoint = 0")
        # One commit, as a SqliteLog's append is.
        connection.execute("BEGIN")
        connection.executemany(
            "INSERT INTO events (session_id, seq, at, type, body) VALUES (?, ?, ?, ?, ?)",
            [(e.session_id, e.seq, e.at, e.type, encode_envelope(e)) for e in more],
        )
        connection.execute("COMMIT")
        copy = tmp_path / "copy"
        copy.mkdir()
        shutil.copy(path, copy / "log.db")
        wal = path.with_name("log.db-wal").read_bytes()
    finally:
        connection.close()
    (copy / "log.db-wal").write_bytes(wal[: len(wal) - 100])
    done = cli("check", "log.db", cwd=copy)
    assert (done.code, done.err) == (0, "")
    assert table(done) == {name: ["15", "idle"] for name in sessions}
    assert summary(done) == ["log.db: 2 sessions: 2 sound, 0 damaged"]


def test_a_torn_jsonl_line_is_noted_and_not_damage(tmp_path: Path) -> None:
    anyio.run(record, JsonlLog(tmp_path / "log"), NAMES[:2])
    with (tmp_path / "log" / "session-001.jsonl").open("ab") as file:
        file.write(b'{"session_id": "session-001", "seq": 16, "at"')
    done = cli("check", "log", cwd=tmp_path)
    assert done.code == 0
    # What the log warns of goes to stderr, apart from the table.
    assert "jsonl log: torn last line skipped" in done.err
    rows = table(done)
    assert rows["session-000"] == ["15", "idle"]
    assert rows["session-001"][:2] == ["15", "idle"]
    assert rows["session-001"][2].startswith("line 16 skipped: a write cut short")


def test_a_byte_damaged_jsonl_line_is_found(tmp_path: Path) -> None:
    anyio.run(record, JsonlLog(tmp_path / "log"), NAMES[:3])
    path = tmp_path / "log" / "session-001.jsonl"
    data = bytearray(path.read_bytes())
    data[data.index(b'"seq":5') + 1] = 0xFF
    path.write_bytes(bytes(data))
    done = cli("check", "log", cwd=tmp_path)
    assert done.code == 1
    rows = table(done)
    assert rows["session-001"][:2] == ["-", "damaged"]
    assert rows["session-001"][2].startswith("session-001.jsonl (session session-001), line 5")
    assert rows["session-000"] == rows["session-002"] == ["15", "idle"]
    assert summary(done) == ["log: 3 sessions: 2 sound, 1 damaged"]


def test_a_jsonl_session_cut_short_is_found(tmp_path: Path) -> None:
    anyio.run(record, JsonlLog(tmp_path / "log"), NAMES[:2])
    path = tmp_path / "log" / "session-000.jsonl"
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:3]))
    done = cli("check", "log", cwd=tmp_path)
    assert done.code == 1
    assert table(done)["session-000"] == [
        "-",
        "damaged",
        "session-000.jsonl (session session-000) holds 3 events, but the order file records "
        "seq 15 of it",
    ]


def test_a_jsonl_file_is_checked_line_by_line(tmp_path: Path) -> None:
    sessions = {name: anyio.run(session, name) for name in NAMES[:2]}
    events = sessions["session-000"] + sessions["session-001"]
    (tmp_path / "all.jsonl").write_bytes(encode_jsonl(events))
    done = cli("check", "all.jsonl", cwd=tmp_path)
    assert (done.code, table(done)) == (0, {name: ["15", "idle"] for name in sessions})
    (tmp_path / "gap.jsonl").write_bytes(encode_jsonl(events[:5] + events[6:]))
    gap = cli("check", "gap.jsonl", cwd=tmp_path)
    assert gap.code == 1
    assert table(gap)["session-000"][1:] == ["damaged", "seq 7 leaves a gap (expected seq 6)"]


def test_a_file_that_is_not_a_database_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "log.db").write_bytes(b"this is not a database at all, just some text. " * 40)
    done = cli("check", "log.db", cwd=tmp_path)
    assert done.code == 1
    assert summary(done) == [
        "log.db: 0 sessions: 0 sound, 0 damaged",
        "log.db: cannot be read: not a readable SQLite event log: file is not a database",
    ]


@pytest.mark.parametrize(
    ("name", "error"),
    [("missing.db", "missing.db: no such log file"), ("empty.db", "an empty file, not a log")],
)
def test_no_log_there_is_exit_2(tmp_path: Path, name: str, error: str) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    done = cli("check", name, cwd=tmp_path)
    assert done.code == 2
    assert error in done.err
    assert (tmp_path / "empty.db").read_bytes() == b""
