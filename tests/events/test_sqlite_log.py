"""SqliteLog's own behaviour: group commit, WAL readers in another process, bad files and rows."""

from __future__ import annotations

import itertools
import json
import sqlite3
import sys
from functools import partial
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.events.test_logs import envelope, run
from turnkeeper.events import Envelope, LogCorrupt, LogError, SeqError
from turnkeeper.events._log import SeqConflict
from turnkeeper.events._sqlite_log import SqliteLog


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
from turnkeeper.events._sqlite_log import SqliteLog

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
