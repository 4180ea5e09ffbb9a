"""SqliteLog's own behaviour: group commit, WAL readers in another process, bad files and rows."""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import re
import sqlite3
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.logs.test_logs import envelope, run
from turnkeeper.core import LogCorrupt, LogError, SeqError
from turnkeeper.events import Envelope, MessageReceived, encode_envelope
from turnkeeper.logs import _sqlite_file as sqlite_file
from turnkeeper.logs import _sqlite_log as sqlite_log
from turnkeeper.logs._log import Batch, SeqConflict
from turnkeeper.logs._sqlite_file import StoredChain
from turnkeeper.logs._sqlite_log import SqliteLog
from turnkeeper.providers import ScriptedChat
from turnkeeper.sessions import Host


def execute(path: Path, *statements: str) -> None:
    """Run SQL on the file directly, as someone tampering with it would."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            connection.execute(statement)
    finally:
        connection.close()


def journal_mode(path: Path) -> str:
    connection = sqlite3.connect(path)
    try:
        (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
        return str(mode)
    finally:
        connection.close()


@pytest.mark.anyio
async def test_concurrent_appends_share_few_transactions(tmp_path: Path) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append([envelope("warmup", 1)], expected_seq=0)
        before = log.commits
        async with anyio.create_task_group() as group:
            for index in range(100):
                group.start_soon(partial(log.append, run(f"s{index}", 1, 2), expected_seq=0))
        commits = log.commits - before
        assert 1 <= commits <= 10
        for index in range(100):
            assert await log.read(f"s{index}") == run(f"s{index}", 1, 2)


@pytest.mark.anyio
async def test_a_conflict_fails_only_its_own_append_in_a_shared_transaction(
    tmp_path: Path,
) -> None:
    outcomes: dict[str, str] = {}

    async def append(log: SqliteLog, session_id: str, expected_seq: int) -> None:
        try:
            await log.append([envelope(session_id, expected_seq + 1)], expected_seq=expected_seq)
            outcomes[session_id] = "ok"
        except SeqConflict as exc:
            outcomes[session_id] = f"conflict at {exc.actual}"

    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append(run("old", 1, 3), expected_seq=0)
        before = log.commits
        async with anyio.create_task_group() as group:
            for index in range(30):
                group.start_soon(append, log, f"s{index}", 0)
            group.start_soon(append, log, "old", 1)
            for index in range(30, 60):
                group.start_soon(append, log, f"s{index}", 0)
        assert outcomes.pop("old") == "conflict at 3"
        assert set(outcomes.values()) == {"ok"}
        assert len(outcomes) == 60
        assert log.commits - before <= 10
        assert await log.read("old") == run("old", 1, 3)


@pytest.mark.anyio
async def test_queued_appends_to_one_session_land_in_order(tmp_path: Path) -> None:
    async def append(
        log: SqliteLog,
        events: list[Envelope],
        expected_seq: int,
        *,
        task_status: anyio.abc.TaskStatus[None],
    ) -> None:
        task_status.started()
        await log.append(events, expected_seq=expected_seq)

    async with SqliteLog(tmp_path / "log.db") as log:
        async with anyio.create_task_group() as group:
            await group.start(append, log, run("busy", 1, 1), 0)
            await group.start(append, log, run("s1", 1, 2), 0)
            await group.start(append, log, run("s1", 3, 1), 2)
            await group.start(append, log, run("s1", 4, 2), 3)
        assert await log.read("s1") == run("s1", 1, 5)
        assert log.commits <= 3


@pytest.mark.anyio
async def test_a_cancelled_append_is_all_or_nothing_and_spares_the_others(
    tmp_path: Path,
) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append([envelope("warmup", 1)], expected_seq=0)
        async with anyio.create_task_group() as group:
            for index in range(20):
                group.start_soon(partial(log.append, run(f"s{index}", 1, 3), expected_seq=0))
            with anyio.CancelScope() as scope:
                scope.cancel()
                await log.append(run("cancelled", 1, 3), expected_seq=0)
        assert await log.read("cancelled") in ([], run("cancelled", 1, 3))
        for index in range(20):
            assert await log.last_seq(f"s{index}") == 3
        await log.append([envelope("warmup", 2)], expected_seq=1)


@pytest.mark.anyio
async def test_the_file_is_in_wal_mode_and_its_directory_is_made(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "log.db"
    async with SqliteLog(path) as log:
        await log.append([envelope("s1", 1)], expected_seq=0)
        assert journal_mode(path) == "wal"


READER = """
import json, sys
import anyio
from turnkeeper.logs._sqlite_log import SqliteLog

async def main() -> None:
    counts = {}
    async with SqliteLog(sys.argv[1]) as log:
        for session_id in await log.sessions():
            events = await log.read(session_id)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            counts[session_id] = len(events)
    print(json.dumps(counts))

anyio.run(main)
"""


@pytest.mark.anyio
async def test_another_process_reads_the_file_while_this_one_writes(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        for index in range(5):
            await log.append([envelope(f"s{index}", 1)], expected_seq=0)
        reader_done = anyio.Event()

        async def keep_writing() -> None:
            seq = 1
            while not reader_done.is_set():
                seq += 1
                for index in range(5):
                    await log.append([envelope(f"s{index}", seq)], expected_seq=seq - 1)

        async with anyio.create_task_group() as group:
            group.start_soon(keep_writing)
            result = await anyio.run_process([sys.executable, "-c", READER, str(path)])
            reader_done.set()
        counts = json.loads(result.stdout)
        assert sorted(counts) == [f"s{index}" for index in range(5)]
        for session_id, count in counts.items():
            assert 1 <= count <= await log.last_seq(session_id)


@pytest.mark.anyio
async def test_a_file_that_is_not_a_database_is_log_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    path.write_bytes(b"this is not a database at all, just some text. " * 40)
    with pytest.raises(LogCorrupt, match=r"log\.db: not a readable SQLite event log"):
        async with SqliteLog(path):
            pass


@pytest.mark.anyio
async def test_a_database_of_another_application_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    execute(path, "CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT)")
    with pytest.raises(LogError, match="table events already exists"):
        await SqliteLog(path).sessions()


@pytest.mark.anyio
async def test_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    execute(path, "PRAGMA user_version = 7")
    with pytest.raises(LogError, match="schema version 7 is not turnkeeper's"):
        await SqliteLog(path).sessions()


@pytest.mark.anyio
async def test_a_version_1_file_is_upgraded_and_keeps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("old", 1, 2), expected_seq=0)
    # Version 1 had no trigger: its writer inserted the sessions' rows itself.
    execute(path, "DROP TRIGGER session_opened", "PRAGMA user_version = 1")
    async with SqliteLog(path) as log:
        await log.append(run("new", 1, 1), expected_seq=0)
        await log.append(run("old", 3, 1), expected_seq=2)
        assert await log.sessions() == ["old", "new"]
        assert await log.read("old") == run("old", 1, 3)
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA user_version").fetchone() == (2,)
    finally:
        connection.close()


@pytest.mark.anyio
async def test_a_body_of_another_event_is_log_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
    execute(path, "UPDATE events SET body = (SELECT body FROM events WHERE seq = 1) WHERE seq = 2")
    async with SqliteLog(path) as log:
        with pytest.raises(LogCorrupt, match="session s1 seq 2: body holds session s1 seq 1"):
            await log.read("s1")
        with pytest.raises(LogCorrupt, match="session s1 seq 2"):
            await log.read_all()


@pytest.mark.anyio
async def test_a_missing_row_is_a_seq_error(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
    execute(path, "DELETE FROM events WHERE seq = 2")
    async with SqliteLog(path) as log:
        with pytest.raises(SeqError, match=r"log\.db: session s1: seq 3 .*expected seq 2"):
            await log.read("s1")


_counter = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.one_of(
        st.binary(max_size=200),
        st.text(max_size=50),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.none(),
    )
)
@pytest.mark.anyio
async def test_any_bad_stored_body_raises_log_corrupt_naming_the_row(
    tmp_path: Path, body: bytes | str | int | None
) -> None:
    path = tmp_path / f"{next(_counter)}.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("UPDATE events SET body = ? WHERE seq = 2", (body,))
    except sqlite3.IntegrityError:
        connection.execute("UPDATE events SET body = X'00' WHERE seq = 2")
    finally:
        connection.close()
    async with SqliteLog(path) as log:
        with pytest.raises(LogCorrupt, match="session s1 seq 2"):
            await log.read("s1")
        assert await log.read("s1", limit=1) == run("s1", 1, 1)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.one_of(
        st.binary(min_size=1, max_size=2000),
        st.binary(max_size=2000).map(lambda tail: b"SQLite format 3\x00" + tail),
    )
)
@pytest.mark.anyio
async def test_any_bytes_as_the_file_raise_only_log_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / f"{next(_counter)}.db"
    path.write_bytes(data)
    try:
        async with SqliteLog(path) as log:
            await log.append([envelope("s1", 1)], expected_seq=0)
            assert await log.read("s1") == [envelope("s1", 1)]
    except LogError:
        pass


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads fetch three rows at a time, so a few events span several pages."""
    monkeypatch.setattr(sqlite_log, "_PAGE", 3)


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
async def test_reads_span_pages_with_any_after_and_limit(tmp_path: Path) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        for first in range(1, 11, 2):
            await log.append(run("s1", first, 2), expected_seq=first - 1)
            await log.append(run("s2", first, 2), expected_seq=first - 1)
        everything = await log.read_all()
        assert [e for _, e in everything if e.session_id == "s1"] == run("s1", 1, 10)
        for after in range(12):
            for limit in (None, 1, 2, 3, 4, 7, 11):
                expected = run("s1", 1, 10)[after:]
                assert await log.read("s1", after=after, limit=limit) == expected[:limit]
                position = everything[after - 1][0] if after else 0
                window = everything[after:] if limit is None else everything[after : after + limit]
                assert await log.read_all(after=position, limit=limit) == window


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
@pytest.mark.parametrize(
    ("corruption", "message"),
    [
        (
            "UPDATE events SET body = substr(body, 1, 40) WHERE seq = 8",
            "session s1 seq 8: not an event envelope",
        ),
        (
            "UPDATE events SET body = (SELECT body FROM events WHERE seq = 7) WHERE seq = 8",
            "session s1 seq 8: body holds session s1 seq 7",
        ),
    ],
)
async def test_a_bad_row_on_a_later_page_is_named(
    tmp_path: Path, corruption: str, message: str
) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 10), expected_seq=0)
    execute(path, corruption)
    async with SqliteLog(path) as log:
        with pytest.raises(LogCorrupt, match=message):
            await log.read("s1")
        with pytest.raises(LogCorrupt, match=message):
            await log.read_all()
        assert await log.read("s1", limit=7) == run("s1", 1, 7)
        assert [e for _, e in await log.read_all(limit=7)] == run("s1", 1, 7)


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
async def test_a_missing_row_on_a_later_page_is_a_seq_error(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 10), expected_seq=0)
    execute(path, "DELETE FROM events WHERE seq = 8")
    async with SqliteLog(path) as log:
        with pytest.raises(SeqError, match=r"session s1: seq 9 .*expected seq 8"):
            await log.read("s1")


def bodies(path: Path) -> list[bytes]:
    connection = sqlite3.connect(path)
    try:
        return [row[0] for row in connection.execute("SELECT body FROM events ORDER BY pos")]
    finally:
        connection.close()


def set_body(path: Path, seq: int, body: bytes | str) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("UPDATE events SET body = ? WHERE seq = ?", (body, seq))
    finally:
        connection.close()


@pytest.mark.anyio
async def test_a_body_holding_two_envelopes_is_log_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
    first, second, _ = bodies(path)
    set_body(path, 2, second + b"," + first)
    async with SqliteLog(path) as log:
        with pytest.raises(LogCorrupt, match="session s1 seq 2: not an event envelope"):
            await log.read("s1")
        with pytest.raises(LogCorrupt, match="session s1 seq 2"):
            await log.read_all()


@pytest.mark.anyio
async def test_bodies_that_complete_each_other_are_log_corrupt(tmp_path: Path) -> None:
    # Joined into one array, these two rows read as the envelopes their columns name; each
    # alone is not an envelope, and that is what counts.
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
    _, second, third = bodies(path)
    set_body(path, 2, second[:-1] + b',"x":[0')
    set_body(path, 3, b"1]}," + third)
    async with SqliteLog(path) as log:
        with pytest.raises(LogCorrupt, match="session s1 seq 2: not an event envelope"):
            await log.read("s1")
        with pytest.raises(LogCorrupt, match="session s1 seq 2"):
            await log.read_all()


@pytest.mark.anyio
async def test_a_body_stored_as_text_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
    execute(path, "UPDATE events SET body = CAST(body AS TEXT) WHERE seq = 2")
    async with SqliteLog(path) as log:
        assert await log.read("s1") == run("s1", 1, 3)
        assert [e for _, e in await log.read_all()] == run("s1", 1, 3)


@pytest.mark.anyio
async def test_reads_leave_the_garbage_collector_as_they_found_it(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
    set_body(path, 3, b"{")
    async with SqliteLog(path) as log:
        assert gc.isenabled()
        with pytest.raises(LogCorrupt):
            await log.read("s1")
        assert gc.isenabled()
        assert await log.read("s1", limit=2) == run("s1", 1, 2)
        assert gc.isenabled()
        gc.disable()
        try:
            assert await log.read("s1", limit=2) == run("s1", 1, 2)
            assert not gc.isenabled()
        finally:
            gc.enable()


def insert(path: Path, events: list[Envelope]) -> None:
    """Write events into the file directly, as a writer that takes no lock would (one of
    an older turnkeeper, say)."""
    rows = [(e.session_id, e.seq, e.at, e.type, encode_envelope(e)) for e in events]
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.executemany(
            "INSERT INTO events (session_id, seq, at, type, body) VALUES (?, ?, ?, ?, ?)", rows
        )
    finally:
        connection.close()


@pytest.mark.anyio
async def test_a_writer_that_takes_no_lock_between_two_appends_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
        insert(path, run("s1", 3, 1))
        with pytest.raises(SeqConflict) as conflict:
            await log.append(run("s1", 3, 1), expected_seq=2)
        assert conflict.value.actual == 3
        await log.append(run("s1", 4, 1), expected_seq=3)
        insert(path, run("s2", 1, 1))
        with pytest.raises(SeqConflict) as created:
            await log.append(run("s2", 1, 1), expected_seq=0)
        assert created.value.actual == 1
        assert await log.read("s1") == run("s1", 1, 4)
        assert await log.sessions() == ["s1", "s2"]


def lock_file(path: Path) -> Path:
    return path.with_name(f"{path.name}-writer.lock")


def names(directory: Path) -> list[str]:
    """The names of the entries in `directory`."""
    return sorted(path.name for path in directory.iterdir())


@pytest.mark.anyio
async def test_a_second_log_on_a_file_only_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as writer:
        await writer.append(run("s1", 1, 2), expected_seq=0)
        was_writable = writer.writable
        async with SqliteLog(path) as second:
            assert not second.writable
            assert await second.read("s1") == run("s1", 1, 2)
            for events, expected in ((run("s1", 3, 1), 2), (run("s2", 1, 1), 0)):
                with pytest.raises(LogError) as refused:
                    await second.append(events, expected_seq=expected)
                assert str(refused.value) == (
                    f"{path}: this log only reads the file: another log writes it "
                    f"(it holds the writer lock {lock_file(path)})"
                )
            await writer.append(run("s1", 3, 1), expected_seq=2)
            assert await second.read("s1") == run("s1", 1, 3)
        # The second log's close leaves the writer's lock alone.
        await writer.append(run("s1", 4, 1), expected_seq=3)
    assert (was_writable, writer.writable) == (True, False)
    # Once the writer has closed, the next log to open writes.
    async with SqliteLog(path) as log:
        assert log.writable
        await log.append(run("s1", 5, 1), expected_seq=4)
        assert await log.read("s1") == run("s1", 1, 5)


SECOND_WRITER = """
import sys
import anyio
from tests.logs.test_logs import run
from turnkeeper.core import LogError
from turnkeeper.logs._sqlite_log import SqliteLog

async def main() -> None:
    async with SqliteLog(sys.argv[1]) as log:
        seqs = [e.seq for e in await log.read("s1")]
        try:
            await log.append(run("s1", len(seqs) + 1, 1), expected_seq=len(seqs))
        except LogError as exc:
            print(log.writable, seqs, exc)
        else:
            print(log.writable, seqs, "appended")

anyio.run(main)
"""


@pytest.mark.anyio
async def test_a_log_in_another_process_only_reads_while_this_one_writes(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    second = [sys.executable, "-c", SECOND_WRITER, str(path)]
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
        refused = (await anyio.run_process(second)).stdout.decode()
        assert refused == (
            f"False [1] {path}: this log only reads the file: another log writes it "
            f"(it holds the writer lock {lock_file(path)})\n"
        )
        await log.append(run("s1", 2, 1), expected_seq=1)
    appended = (await anyio.run_process(second)).stdout.decode()
    assert appended == "True [1, 2] appended\n"
    async with SqliteLog(path, read_only=True) as reader:
        assert await reader.read("s1") == run("s1", 1, 3)


@pytest.mark.anyio
async def test_a_log_opened_through_a_symlink_is_the_same_log(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    (tmp_path / "link.db").symlink_to(path)
    async with SqliteLog(path) as writer, SqliteLog(tmp_path / "link.db") as second:
        assert (writer.writable, second.writable) == (True, False)
    async with SqliteLog(tmp_path / "link.db") as writer, SqliteLog(path) as second:
        assert (writer.writable, second.writable) == (True, False)


@pytest.mark.anyio
async def test_a_closed_log_releases_its_lock_even_if_a_forked_child_shares_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as writer:
        await writer.append(run("s1", 1, 1), expected_seq=0)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            # The child holds the lock's descriptor until the parent says it is done.
            os.close(write)
            os.read(read, 1)
            os._exit(0)
        os.close(read)
    try:
        async with SqliteLog(path) as log:
            assert log.writable
    finally:
        os.close(write)
        await anyio.to_thread.run_sync(os.waitpid, child, 0)


@pytest.mark.anyio
async def test_a_read_only_log_reads_beside_a_writer_and_never_blocks_it(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
    async with SqliteLog(path, read_only=True) as reader:
        assert not reader.writable
        assert await reader.read("s1") == run("s1", 1, 1)
        # Opened after the reader, the writer takes the lock, and its appends do not wait.
        async with SqliteLog(path) as writer:
            assert writer.writable
            for seq in range(2, 12):
                with anyio.fail_after(2):
                    await writer.append(run("s1", seq, 1), expected_seq=seq - 1)
                    assert await reader.last_seq("s1") == seq
            assert [e for _, e in await reader.read_all()] == run("s1", 1, 11)
            with pytest.raises(
                LogError, match="this log only reads the file: it was opened read_only"
            ):
                await reader.append(run("s2", 1, 1), expected_seq=0)
            with anyio.fail_after(2):
                async with SqliteLog(path, read_only=True) as beside:
                    assert await beside.read("s1") == run("s1", 1, 11)
    assert repr(reader) == f"SqliteLog({str(path)!r}, read_only=True)"


@pytest.mark.anyio
async def test_a_read_only_log_never_writes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
    # A version 1 file reads as it is: only a writer upgrades it.
    execute(path, "DROP TRIGGER session_opened", "PRAGMA user_version = 1")
    lock_file(path).unlink()
    before = path.read_bytes()
    async with SqliteLog(path, read_only=True) as reader:
        assert await reader.sessions() == ["s1"]
        assert await reader.read("s1") == run("s1", 1, 2)
    assert path.read_bytes() == before
    assert not lock_file(path).exists()


@pytest.mark.anyio
async def test_a_read_only_log_needs_a_turnkeeper_log_there(tmp_path: Path) -> None:
    with pytest.raises(LogError, match=r"missing\.db: no log file there"):
        await SqliteLog(tmp_path / "missing.db", read_only=True).sessions()
    assert names(tmp_path) == []
    execute(tmp_path / "other.db", "CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT)")
    with pytest.raises(LogError, match=r"other\.db: not a turnkeeper event log"):
        await SqliteLog(tmp_path / "other.db", read_only=True).sessions()
    execute(tmp_path / "other.db", "PRAGMA user_version = 7")
    with pytest.raises(LogError, match="schema version 7 is not turnkeeper's"):
        await SqliteLog(tmp_path / "other.db", read_only=True).sessions()
    (tmp_path / "text.db").write_bytes(b"this is not a database at all, just some text. " * 40)
    with pytest.raises(LogCorrupt, match=r"text\.db: not a readable SQLite event log"):
        await SqliteLog(tmp_path / "text.db", read_only=True).sessions()


@pytest.mark.anyio
async def test_an_open_that_fails_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
    execute(path, "PRAGMA user_version = 7")
    log = SqliteLog(path)
    with pytest.raises(LogError, match="schema version 7 is not turnkeeper's"):
        await log.sessions()
    execute(path, "PRAGMA user_version = 2")
    async with SqliteLog(path) as other:
        assert other.writable
        await other.append(run("s1", 2, 1), expected_seq=1)
    # The log that failed to open opens on its next use, and writes.
    await log.append(run("s1", 3, 1), expected_seq=2)
    assert log.writable
    await log.close()


@pytest.mark.anyio
@pytest.mark.parametrize("fails", [False, True], ids=["then-opens", "then-fails"])
async def test_an_open_cancelled_while_it_holds_the_lock_releases_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    path = tmp_path / "log.db"
    opening = threading.Event()
    go_on = threading.Event()
    real_connect = sqlite_file._connect

    def slow_connect(path: Path) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        opening.set()
        go_on.wait()
        if fails:
            raise LogError("the disk went away")
        return real_connect(path)

    async def use(log: SqliteLog) -> None:
        with contextlib.suppress(LogError):
            async with log:
                await anyio.sleep_forever()

    monkeypatch.setattr(sqlite_file, "_connect", slow_connect)
    log = SqliteLog(path)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(use, log)
            assert await anyio.to_thread.run_sync(opening.wait, 10)
            scope.cancel()
            # The thread, holding the lock, goes on to connect after the cancel.
            go_on.set()
    assert not log.writable
    monkeypatch.setattr(sqlite_file, "_connect", real_connect)
    async with SqliteLog(path) as other:
        assert other.writable
        await other.append(run("s1", 1, 1), expected_seq=0)


class FailsAfterInsert:
    """The writer's connection, but the next insert of events reports an error after its
    rows have been committed."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.armed = True

    def execute(self, sql: str, *parameters: Any) -> sqlite3.Cursor:
        cursor = self.connection.execute(sql, *parameters)
        if sql.startswith("INSERT INTO events") and self.armed:
            self.armed = False
            raise sqlite3.OperationalError("disk I/O error (after the commit)")
        return cursor

    @property
    def in_transaction(self) -> bool:
        return self.connection.in_transaction

    def close(self) -> None:
        self.connection.close()


@pytest.mark.anyio
async def test_after_a_failed_commit_the_file_has_the_last_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
        writer = log._writer
        monkeypatch.setattr(writer, "_connection", FailsAfterInsert(writer._connection))
        with pytest.raises(LogError, match="disk I/O error"):
            await log.append(run("s1", 2, 1), expected_seq=1)
        # The append did land: appending it again is a conflict, and the next one follows it.
        with pytest.raises(SeqConflict) as conflict:
            await log.append(run("s1", 2, 1), expected_seq=1)
        assert conflict.value.actual == 2
        await log.append(run("s1", 3, 1), expected_seq=2)
        assert await log.read("s1") == run("s1", 1, 3)


class HeldCommits:
    """Stands in for a log's `_commit`: each call waits in its worker thread until released."""

    def __init__(self, commit: Callable[[list[Batch]], list[LogError | None]]) -> None:
        self.commit = commit
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.rounds: list[list[str]] = []

    def __call__(self, batches: list[Batch]) -> list[LogError | None]:
        self.rounds.append([f"{batch.session_id}@{batch.expected_seq}" for batch in batches])
        self.entered.release()
        self.release.wait()
        return self.commit(batches)

    async def wait_entered(self) -> None:
        await anyio.to_thread.run_sync(self.entered.acquire)


@pytest.mark.anyio
async def test_appends_during_a_commit_share_the_next_round_and_conflict_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes: dict[str, str] = {}

    async def append(log: SqliteLog, name: str, events: list[Envelope], expected: int) -> None:
        try:
            await log.append(events, expected_seq=expected)
            outcomes[name] = "ok"
        except SeqConflict as exc:
            outcomes[name] = f"conflict at {exc.actual}"

    async with SqliteLog(tmp_path / "log.db") as log:
        held = HeldCommits(log._writer._commit)
        monkeypatch.setattr(log._writer, "_commit", held)
        async with anyio.create_task_group() as group:
            group.start_soon(append, log, "first", run("s0", 1, 1), 0)
            await held.wait_entered()
            for index in range(20):
                group.start_soon(append, log, f"s{index + 1}", run(f"s{index + 1}", 1, 2), 0)
            await anyio.wait_all_tasks_blocked()
            group.start_soon(append, log, "twin", run("s1", 1, 1), 0)
            await anyio.wait_all_tasks_blocked()
            held.release.set()
        assert outcomes.pop("twin") == "conflict at 2"
        assert set(outcomes.values()) == {"ok"}
        assert [len(batches) for batches in held.rounds] == [1, 21]
        assert log.commits == 2
        for index in range(1, 21):
            assert await log.read(f"s{index}") == run(f"s{index}", 1, 2)


@pytest.mark.anyio
async def test_a_damaged_session_fails_only_its_own_append_in_a_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        for session_id in ("bad", "s1", "s2", "s3"):
            await log.append(run(session_id, 1, 1), expected_seq=0)
    execute(path, "UPDATE events SET seq = 'one' WHERE session_id = 'bad'")
    outcomes: dict[str, str] = {}

    async def append(log: SqliteLog, session_id: str, expected: int) -> None:
        try:
            await log.append(run(session_id, expected + 1, 1), expected_seq=expected)
            outcomes[session_id] = "ok"
        except LogError as exc:
            outcomes[session_id] = f"{type(exc).__name__}: {exc}"

    async with SqliteLog(path) as log:
        held = HeldCommits(log._writer._commit)
        monkeypatch.setattr(log._writer, "_commit", held)
        async with anyio.create_task_group() as group:
            group.start_soon(append, log, "new", 0)
            await held.wait_entered()
            for session_id in ("s1", "bad", "s2", "s3"):
                group.start_soon(append, log, session_id, 1)
            await anyio.wait_all_tasks_blocked()
            held.release.set()
        assert [sorted(names) for names in held.rounds] == [
            ["new@0"],
            ["bad@1", "s1@1", "s2@1", "s3@1"],
        ]
        assert (
            outcomes.pop("bad") == f"LogCorrupt: {path}: session bad: seq 'one' is not an integer"
        )
        assert set(outcomes.values()) == {"ok"}
        for session_id in ("s1", "s2", "s3"):
            assert await log.read(session_id) == run(session_id, 1, 2)


@pytest.mark.anyio
async def test_a_cancelled_append_is_written_once_taken_and_not_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scopes: dict[str, anyio.CancelScope] = {}
    outcomes: dict[str, str] = {}

    async def append(log: SqliteLog, session_id: str) -> None:
        with anyio.CancelScope() as scope:
            scopes[session_id] = scope
            await log.append(run(session_id, 1, 2), expected_seq=0)
            outcomes[session_id] = "ok"
        if scope.cancelled_caught:
            # As the cancellation is raised, the log says whether the append was written.
            outcomes[session_id] = f"cancelled at seq {await log.last_seq(session_id)}"

    async with SqliteLog(tmp_path / "log.db") as log:
        held = HeldCommits(log._writer._commit)
        monkeypatch.setattr(log._writer, "_commit", held)
        async with anyio.create_task_group() as group:
            # Round one is taken and held in the writer thread; two more gather behind it.
            group.start_soon(append, log, "a")
            await held.wait_entered()
            for session_id in ("b", "c"):
                group.start_soon(append, log, session_id)
            await anyio.wait_all_tasks_blocked()
            for session_id in ("a", "b"):
                scopes[session_id].cancel()
            await anyio.wait_all_tasks_blocked()
            held.release.set()
        assert held.rounds == [["a@0"], ["c@0"]]
        assert outcomes == {"a": "cancelled at seq 2", "b": "cancelled at seq 0", "c": "ok"}
        # Cancelled once its round had been taken, an append is written; before, it is not.
        for session_id in ("a", "c"):
            assert await log.read(session_id) == run(session_id, 1, 2)
        assert await log.last_seq("b") == 0
        await log.append(run("b", 1, 2), expected_seq=0)


@pytest.mark.anyio
async def test_every_close_returns_once_the_appends_in_flight_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []

    async def close(log: SqliteLog, name: str) -> None:
        await log.close()
        reader = SqliteLog(log.path, read_only=True)
        closed.append(f"{name} at seq {await reader.last_seq('a')}")
        await reader.close()

    log = SqliteLog(tmp_path / "log.db")
    async with anyio.create_task_group() as group:
        await log.append(run("a", 1, 1), expected_seq=0)
        held = HeldCommits(log._writer._commit)
        monkeypatch.setattr(log._writer, "_commit", held)
        group.start_soon(partial(log.append, run("a", 2, 2), expected_seq=1))
        await held.wait_entered()
        group.start_soon(close, log, "first")
        group.start_soon(close, log, "second")
        await anyio.wait_all_tasks_blocked()
        assert closed == []
        held.release.set()
    assert sorted(closed) == ["first at seq 3", "second at seq 3"]


@pytest.mark.anyio
async def test_rounds_of_any_size_land_whole(tmp_path: Path) -> None:
    # A statement holds 8, 16, ... 4096 rows; a round of more takes several, and an
    # append of more takes several of its own.
    sizes = [1, 7, 8, 9, 63, 64, 65, 130, 1000, 4095, 4096, 4097, 9000]
    async with SqliteLog(tmp_path / "log.db") as log:
        async with anyio.create_task_group() as group:
            for size in sizes:
                group.start_soon(partial(log.append, run(f"s{size}", 1, size), expected_seq=0))
        for size in sizes:
            await log.append(run(f"s{size}", size + 1, size), expected_seq=size)
        for size in sizes:
            assert await log.read(f"s{size}") == run(f"s{size}", 1, 2 * size)
        assert len(await log.read_all()) == 2 * sum(sizes)
        assert sorted(await log.sessions()) == sorted(f"s{size}" for size in sizes)


@pytest.mark.anyio
async def test_a_conflict_in_an_append_too_long_for_one_statement_writes_none_of_it(
    tmp_path: Path,
) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append(run("s1", 1, 4097), expected_seq=0)
        # Its first statement's rows fail their check; its second statement's would pass
        # (they expect seq 4097), but it never runs.
        with pytest.raises(SeqConflict) as conflict:
            await log.append(run("s1", 2, 5000), expected_seq=1)
        assert conflict.value.actual == 4097
        await log.append(run("s2", 1, 1), expected_seq=0)
        with pytest.raises(SeqConflict):
            await log.append(run("s2", 1, 5000), expected_seq=0)
        assert await log.read("s1") == run("s1", 1, 4097)
        assert await log.read("s2") == run("s2", 1, 1)


def statements(log: SqliteLog) -> list[str]:
    """The statements the log's read connection runs from now on, as they run."""
    ran: list[str] = []
    log._reader.set_trace_callback(ran.append)
    return ran


def row_by_row(ran: list[str]) -> bool:
    """Whether any of the statements fetched rows one by one rather than as aggregates."""
    return any(statement.startswith("SELECT pos, session_id") for statement in ran)


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
async def test_pages_are_fetched_as_one_row_of_aggregates(tmp_path: Path) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append(run("s1", 1, 7), expected_seq=0)
        await log.append(run("s2", 1, 2), expected_seq=0)
        ran = statements(log)
        assert await log.read("s1") == run("s1", 1, 7)
        assert [e for _, e in await log.read_all()] == run("s1", 1, 7) + run("s2", 1, 2)
        assert await log.read("s1", after=7) == []
        assert await log.read_all(after=9) == []
        assert ran
        assert not row_by_row(ran)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ("session_id = CAST(session_id AS BLOB)", "session b's1' seq 2: body holds session s1"),
        ("seq = CAST(seq AS BLOB)", "session s1 seq b'2': body holds session s1 seq 2"),
        ("seq = 'x' || seq", "session s1 seq x2: body holds session s1 seq 2"),
        ("seq = seq + 0.5", "session s1 seq 2.5: body holds session s1 seq 2"),
    ],
)
@pytest.mark.anyio
async def test_a_column_not_of_its_type_is_fetched_row_by_row_and_named(
    tmp_path: Path, change: str, error: str
) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
    execute(path, f"UPDATE events SET {change} WHERE seq = 2")
    async with SqliteLog(path) as log:
        ran = statements(log)
        with pytest.raises(LogCorrupt, match=re.escape(error)):
            await log.read_all()
        assert row_by_row(ran)
        assert [e for _, e in await log.read_all(limit=1)] == run("s1", 1, 1)


@pytest.mark.anyio
async def test_a_page_longer_than_sqlites_longest_value_is_fetched_row_by_row(
    tmp_path: Path,
) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        events = run("s1", 1, 20)
        await log.append(events, expected_seq=0)
        # Each body fits; the page's bodies joined do not (as 4,096 bodies of 250 KB
        # would not fit SQLite's default gigabyte).
        longest = max(len(encode_envelope(e)) for e in events)
        log._reader.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, longest * 3)
        ran = statements(log)
        assert await log.read("s1") == events
        assert [e for _, e in await log.read_all()] == events
        assert row_by_row(ran)


@pytest.mark.parametrize("text", ["plain", "naïve ☃"])
@pytest.mark.anyio
async def test_a_text_body_reads_as_its_bytes(tmp_path: Path, text: str) -> None:
    event = MessageReceived(text=text)
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append([envelope("s1", 1), envelope("s1", 2, event)], expected_seq=0)
    execute(path, "UPDATE events SET body = CAST(body AS TEXT) WHERE seq = 2")
    async with SqliteLog(path) as log:
        ran = statements(log)
        assert await log.read("s1") == [envelope("s1", 1), envelope("s1", 2, event)]
        assert not row_by_row(ran)


@pytest.mark.parametrize("spelled", [b'{\n  "text": "hi"}', b'{"text":\n"hi"}\n'])
@pytest.mark.anyio
async def test_a_body_holding_a_newline_is_fetched_row_by_row(
    tmp_path: Path, spelled: bytes
) -> None:
    # The page's bodies are joined by newlines: this one would split in two.
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
    body = (
        b'{"session_id":"s1","seq":2,"at":2.0,"event":'
        + spelled.replace(b'"text"', b'"type":"local.user_message","text"')
        + b"}"
    )
    set_body(path, 2, body)
    async with SqliteLog(path) as log:
        ran = statements(log)
        read = await log.read("s1")
        assert row_by_row(ran)
    assert read[1] == Envelope("s1", 2, 2.0, MessageReceived(text="hi"))
    assert [e.seq for e in read] == [1, 2, 3]


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
async def test_the_next_page_is_fetched_while_a_page_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetching = [threading.Event() for _ in range(2)]
    fetch_page = sqlite_log._fetch_page
    decoded = sqlite_log._decoded

    def fetch(query: Any, parameters: tuple[object, ...], connection: Any) -> Any:
        fetching[sum(event.is_set() for event in fetching)].set()
        return fetch_page(query, parameters, connection)

    def decode(path: Path, page: Any) -> list[Envelope]:
        # Blocks the event loop: only a fetch in another thread can set the event.
        if page.seqs[0] == 1:
            assert fetching[1].wait(timeout=10)
        return decoded(path, page)

    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append(run("s1", 1, 5), expected_seq=0)
        monkeypatch.setattr(sqlite_log, "_fetch_page", fetch)
        monkeypatch.setattr(sqlite_log, "_decoded", decode)
        assert await log.read("s1") == run("s1", 1, 5)


class FailingFetch:
    """Stands for `_fetch_page`; its call number `failing` raises a SQLite error."""

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.calls = 0
        self.fetch_page = sqlite_log._fetch_page

    def __call__(self, query: Any, parameters: tuple[object, ...], connection: Any) -> Any:
        self.calls += 1
        if self.calls == self.failing:
            raise sqlite3.OperationalError("disk I/O error")
        return self.fetch_page(query, parameters, connection)


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
async def test_a_failed_prefetch_raises_its_log_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append(run("s1", 1, 10), expected_seq=0)
        monkeypatch.setattr(sqlite_log, "_fetch_page", FailingFetch(failing=3))
        with pytest.raises(LogError, match=r"log\.db: disk I/O error") as raised:
            await log.read_all()
        assert type(raised.value) is LogError
        monkeypatch.setattr(sqlite_log, "_fetch_page", FailingFetch(failing=2))
        with pytest.raises(LogError, match=r"log\.db: disk I/O error"):
            await log.read("s1")
        assert gc.isenabled()
        assert await log.read("s1") == run("s1", 1, 10)


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
async def test_a_bad_page_wins_over_a_failed_prefetch_of_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 10), expected_seq=0)
    set_body(path, 5, b"{")
    async with SqliteLog(path) as log:
        monkeypatch.setattr(sqlite_log, "_fetch_page", FailingFetch(failing=3))
        with pytest.raises(LogCorrupt, match="session s1 seq 5: not an event envelope"):
            await log.read_all()


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
async def test_a_read_cancelled_while_decoding_leaves_the_log_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = sqlite_log._decoded
    pages = 0
    scope = anyio.CancelScope()

    def decode(path: Path, page: Any) -> list[Envelope]:
        nonlocal pages
        pages += 1
        if pages == 2:
            scope.cancel()
        return decoded(path, page)

    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append(run("s1", 1, 10), expected_seq=0)
        monkeypatch.setattr(sqlite_log, "_decoded", decode)
        with scope:
            await log.read_all()
        assert scope.cancelled_caught
        assert gc.isenabled()
        assert [e for _, e in await log.read_all()] == run("s1", 1, 10)


@pytest.mark.anyio
@pytest.mark.usefixtures("small_pages")
async def test_a_read_cancelled_while_fetching_waits_for_the_fetch_and_leaves_the_log_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetch_page = sqlite_log._fetch_page
    fetching = threading.Event()
    release = threading.Event()

    def fetch(query: Any, parameters: tuple[object, ...], connection: Any) -> Any:
        if parameters[-2] == 3:  # the second page
            fetching.set()
            assert release.wait(timeout=10)
        return fetch_page(query, parameters, connection)

    read: list[list[Envelope]] = []

    async def reading() -> None:
        read.append(await log.read("s1"))

    async with SqliteLog(tmp_path / "log.db") as log:
        await log.append(run("s1", 1, 10), expected_seq=0)
        monkeypatch.setattr(sqlite_log, "_fetch_page", fetch)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(reading)
                await anyio.to_thread.run_sync(fetching.wait)
                group.cancel_scope.cancel()
                release.set()
        finally:
            release.set()
        assert read == []
        assert gc.isenabled()
        monkeypatch.setattr(sqlite_log, "_fetch_page", fetch_page)
        assert await log.read("s1") == run("s1", 1, 10)


@pytest.mark.parametrize(
    "aggregates",
    [
        ("[2,1]", '["s1","s1"]', "[1,1]", b"{}\n{}"),
        ("[1,2]", '["s1"]', "[1,2]", b"{}\n{}"),
        ("[1,2]", '["s1","s1"]', "[1,2]", b"{}"),
        ("[1,2]", '["s1","s1"]', "[1,2]", b"{}\n{}\n{}"),
        ("[1,2]", '["s1","s1"]', "[1,2]", None),
        ("[1,2]", '["s1",2]', "[1,2]", b"{}\n{}"),
    ],
)
def test_aggregates_that_cannot_stand_for_their_rows_are_refused(
    aggregates: tuple[str, str, str, bytes | None],
) -> None:
    # Out of order, of different counts, bodies that split into too few or too many parts,
    # no bodies, another type.
    assert sqlite_log._unpacked(sqlite_log._ALL, *aggregates) is None
    assert sqlite_log._unpacked(sqlite_log._ALL, "[1,2]", '["s1","s1"]', "[1,2]", b"{}\n{}")


async def issue_log(path: Path) -> dict[str, list[Envelope]]:
    """The log of the damage report: 20 sessions of 15 events each."""
    sessions = {f"session-{index:03d}": run(f"session-{index:03d}", 1, 15) for index in range(20)}
    async with SqliteLog(path) as log:
        for events in sessions.values():
            await log.append(events, expected_seq=0)
    # Closed, the log has moved every commit into the file itself.
    assert not path.with_name(f"{path.name}-wal").exists()
    return sessions


def page_size(path: Path) -> int:
    connection = sqlite3.connect(path)
    try:
        (size,) = connection.execute("PRAGMA page_size").fetchone()
        return int(size)
    finally:
        connection.close()


def damage_index_entry(path: Path, session_id: str, seq: int) -> None:
    """Overwrite one byte of the session index's entry for (session_id, seq) in the file,
    so that the entry sorts after the session's others, as bit rot might.

    The entry is found on the index's leaf pages (b-tree page type 10) by its record: a
    header of four bytes (its length, then a text of the id's length, a one-byte seq and
    a rowid), the id, and the seq.
    """
    data = bytearray(path.read_bytes())
    size = page_size(path)
    header = bytes([4, 13 + 2 * len(session_id), 1])
    entry = re.compile(re.escape(header) + rb"[\x01\x02]" + re.escape(session_id.encode()))
    found = []
    for start in range(0, len(data), size):
        if data[start + (100 if start == 0 else 0)] != 10:
            continue
        for match in entry.finditer(data, start, start + size):
            if data[match.end()] == seq:
                found.append(match.end() - 1)
    assert len(found) == 1, found
    data[found[0]] = 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.anyio
async def test_byte_damage_that_shortens_a_session_is_an_error_naming_it(tmp_path: Path) -> None:
    # The damage report's case: one session read back as 3 events of 15, with no error.
    path = tmp_path / "log.db"
    sessions = await issue_log(path)
    damage_index_entry(path, "session-013", 4)
    async with SqliteLog(path) as log:
        # Damage quick_check does not see (the index's pages are sound, their order is not).
        assert log.writable
        with pytest.raises(LogCorrupt) as short:
            await log.read("session-013")
        assert str(short.value) == (
            f"{path}: session session-013: the read stops at seq 3, but its last event is "
            f"seq 15 (a damaged file? see: turnkeeper check {path})"
        )
        with pytest.raises(LogCorrupt, match="session session-013: the read stops at seq 3"):
            await log.read("session-013", limit=10)
        # A read that stops where it was asked to is not short.
        assert await log.read("session-013", limit=2) == sessions["session-013"][:2]
        with pytest.raises(SeqConflict):
            await log.append(run("session-013", 4, 1), expected_seq=3)
        for session_id, events in sessions.items():
            if session_id != "session-013":
                assert await log.read(session_id) == events
        missing = "row 199 missing from index sqlite_autoindex_events_1"
        assert await log.integrity_check() == [missing]
        chains = await log.stored_chains()
        assert chains["session-013"] == StoredChain(15)


@pytest.mark.anyio
async def test_a_session_listed_without_events_is_log_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("a", 1, 2), expected_seq=0)
        await log.append(run("b", 1, 2), expected_seq=0)
    execute(path, "DELETE FROM events WHERE session_id = 'b'")
    async with SqliteLog(path) as log:
        assert await log.sessions() == ["a", "b"]
        with pytest.raises(LogCorrupt) as empty:
            await log.read("b")
        assert str(empty.value) == (
            f"{path}: session b is in the sessions table but has no events "
            f"(a damaged file? see: turnkeeper check {path})"
        )
        assert await log.read("b", after=2) == []
        assert await log.last_seq("b") == 0
        assert await log.read("a") == run("a", 1, 2)
        assert await log.read("never") == []


@pytest.mark.anyio
async def test_rows_deleted_from_the_end_leave_a_shorter_session_that_agrees_with_itself(
    tmp_path: Path,
) -> None:
    # The file records nothing else of a session's length: rows removed from its end as a
    # whole are a shorter session (integrity_check finds nothing either).
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("a", 1, 5), expected_seq=0)
    execute(path, "DELETE FROM events WHERE seq > 3")
    async with SqliteLog(path) as log:
        assert await log.read("a") == run("a", 1, 3)
        assert await log.integrity_check() == []
        assert await log.stored_chains() == {"a": StoredChain(3)}


def damage_page_header(path: Path, table: str) -> None:
    """Overwrite the count of fragmented free bytes in the header of the table's root
    page: damage quick_check finds, and reads do not notice."""
    connection = sqlite3.connect(path)
    try:
        (root,) = connection.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)
        ).fetchone()
    finally:
        connection.close()
    data = bytearray(path.read_bytes())
    offset = (root - 1) * page_size(path) + (100 if root == 1 else 0) + 7
    data[offset] = 16
    path.write_bytes(bytes(data))


@pytest.mark.anyio
async def test_a_file_quick_check_finds_damaged_opens_for_reading_only(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("a", 1, 2), expected_seq=0)
    damage_page_header(path, "sessions")
    because = (
        "SQLite's quick_check finds it damaged (Page 2: free space corruption); "
        f"see: turnkeeper check {path}"
    )
    for read_only in (False, True):
        async with SqliteLog(path, read_only=read_only) as log:
            assert not log.writable
            assert log.read_only_because == because
            assert await log.read("a") == run("a", 1, 2)
            with pytest.raises(LogError) as refused:
                await log.append(run("a", 3, 1), expected_seq=2)
            assert str(refused.value) == f"{path}: this log only reads the file: {because}"
    # The damaged file's writer lock is not held: no log writes it.
    async with SqliteLog(path) as first, SqliteLog(path) as second:
        assert first.read_only_because == second.read_only_because == because
    async with SqliteLog(path) as log:
        with pytest.raises(LogError, match="a host must write its log"):
            async with Host(chat=ScriptedChat([]), log=log):
                pass


@pytest.mark.anyio
async def test_a_sound_file_passes_quick_check_and_writes(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("a", 1, 2), expected_seq=0)
    async with SqliteLog(path) as log:
        assert log.writable
        assert log.read_only_because == ""
        assert await log.integrity_check() == []
        assert await log.stored_chains() == {"a": StoredChain(2)}
    async with SqliteLog(path, read_only=True) as log:
        assert log.read_only_because == "it was opened read_only"


@pytest.mark.anyio
async def test_stored_chains_name_the_first_break_of_each_session(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("a", 1, 5), expected_seq=0)
        await log.append(run("b", 1, 3), expected_seq=0)
        await log.append(run("c", 1, 1), expected_seq=0)
    execute(
        path,
        "DELETE FROM events WHERE session_id = 'a' AND seq IN (2, 4)",
        "UPDATE events SET seq = 7 WHERE session_id = 'b' AND seq = 3",
        "UPDATE events SET session_id = x'00' WHERE session_id = 'c'",
    )
    async with SqliteLog(path) as log:
        assert await log.stored_chains() == {
            "a": StoredChain(3, "seq 3 where seq 2 should be"),
            "b": StoredChain(3, "seq 7 where seq 3 should be"),
            "b'\\x00'": StoredChain(1, "session id b'\\x00' is not text"),
        }


# Root writes a file whatever its mode says: the check runs as root without the
# capabilities that let it ignore file modes (setpriv, of util-linux), as any other user.
UNPRIVILEGED = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
)

READ_ONLY_FILE = """
import json, sys
import anyio
from turnkeeper.core import LogError
from turnkeeper.events import Envelope, MessageReceived
from turnkeeper.logs import SqliteLog
from turnkeeper.providers import ScriptedChat
from turnkeeper.sessions import Host

async def main() -> None:
    async with SqliteLog(sys.argv[1]) as log:
        seen = {
            "writable": log.writable,
            "because": log.read_only_because,
            "events": [e.seq for e in await log.read("s1")],
        }
        try:
            event = MessageReceived(text="more")
            await log.append([Envelope("s1", 3, 3.0, event)], expected_seq=2)
        except LogError as exc:
            seen["append"] = str(exc)
        try:
            async with Host(chat=ScriptedChat([]), log=log):
                pass
        except LogError as exc:
            seen["host"] = str(exc)
    print(json.dumps(seen))

anyio.run(main)
"""


@pytest.mark.anyio
@pytest.mark.parametrize("read_only", ["file", "directory"])
async def test_a_file_sqlite_opens_read_only_is_not_writable(
    tmp_path: Path, read_only: str
) -> None:
    path = tmp_path / "logs" / "log.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
    made_read_only = path if read_only == "file" else path.parent
    made_read_only.chmod(0o444 if read_only == "file" else 0o555)
    try:
        done = await anyio.run_process(
            [*UNPRIVILEGED, sys.executable, "-c", READ_ONLY_FILE, str(path)], check=False
        )
    finally:
        made_read_only.chmod(0o644 if read_only == "file" else 0o755)
    assert done.returncode == 0, done.stderr.decode()
    seen = json.loads(done.stdout)
    because = "SQLite opens it read-only (attempt to write a readonly database)"
    assert seen == {
        "writable": False,
        "because": because,
        "events": [1, 2],
        "append": f"{path}: this log only reads the file: {because}",
        "host": f"Host: SqliteLog({str(path)!r}) only reads (opened read_only, or another "
        "log writes it): a host must write its log",
    }


@pytest.mark.parametrize("table", ["sessions", "events"])
@pytest.mark.parametrize("read_only", [False, True])
def test_a_file_missing_a_table_does_not_open(tmp_path: Path, table: str, read_only: bool) -> None:
    path = tmp_path / "log.sqlite"

    async def make() -> None:
        async with SqliteLog(path) as log:
            await log.append([envelope("s", 1)], expected_seq=0)

    anyio.run(make)
    with sqlite3.connect(path) as connection:
        connection.execute(f"DROP TABLE {table}")

    async def reopen() -> None:
        async with SqliteLog(path, read_only=read_only):
            pass

    with pytest.raises(LogError, match=f"no such table: {table}"):
        anyio.run(reopen)
