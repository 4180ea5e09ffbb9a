"""The SQLite log's checkpointer: WAL pages copied beside the writer, failures dropped,
the thread stopped on close."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.logs.test_logs import run
from turnkeeper.logs._sqlite_checkpointer import WRITER_CHECKPOINT_PAGES, Checkpointer
from turnkeeper.logs._sqlite_log import SqliteLog


class Recording:
    """Stands in for the checkpointer's connection: records each statement, fails the
    ones the test says, and tells the test of each call."""

    def __init__(self, failures: int = 0) -> None:
        self.statements: list[str] = []
        self.failures = failures
        self.called = threading.Semaphore(0)
        self.closed = False

    def execute(self, sql: str) -> Recording:
        self.statements.append(sql)
        self.called.release()
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("disk I/O error")
        return self

    def fetchall(self) -> list[tuple[int, int, int]]:
        return [(0, 0, 0)]

    def close(self) -> None:
        self.closed = True


def eventually(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether `condition` comes true within `seconds`, looked at every 10 ms."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def started(connection: Any, tmp_path: Path) -> Checkpointer:
    return Checkpointer(lambda: connection, tmp_path / "log.sqlite")


class Connects:
    """Stands in for the checkpointer's `connect`: fails the first `failures` times,
    then hands out `connection`."""

    def __init__(self, connection: object, failures: int = 0) -> None:
        self.connection = connection
        self.failures = failures
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("unable to open database file")
        return self.connection


def test_no_commit_no_thread_no_connection_and_no_checkpoint(tmp_path: Path) -> None:
    connection = Recording()
    connects = Connects(connection)
    checkpointer = Checkpointer(connects, tmp_path / "log.sqlite")
    assert not connection.called.acquire(timeout=0.3)
    checkpointer.close()
    assert not checkpointer._thread.is_alive()
    assert checkpointer._thread.ident is None
    assert connects.calls == 0
    assert connection.statements == []
    assert not connection.closed


def test_a_noted_commit_is_checkpointed_passively(tmp_path: Path) -> None:
    connection = Recording()
    checkpointer = started(connection, tmp_path)
    checkpointer.note_commit()
    assert connection.called.acquire(timeout=5)
    checkpointer.close()
    assert connection.statements == ["PRAGMA wal_checkpoint(PASSIVE)"]
    assert checkpointer.checkpoints == 1


def test_commits_noted_during_a_pause_make_one_checkpoint(tmp_path: Path) -> None:
    connection = Recording()
    checkpointer = started(connection, tmp_path)
    for _ in range(100):
        checkpointer.note_commit()
    assert connection.called.acquire(timeout=5)
    assert not connection.called.acquire(timeout=0.3)
    checkpointer.close()
    assert checkpointer.checkpoints == 1


def test_a_failed_checkpoint_is_dropped_and_the_next_commit_checkpointed(
    tmp_path: Path,
) -> None:
    connection = Recording(failures=1)
    checkpointer = started(connection, tmp_path)
    checkpointer.note_commit()
    assert connection.called.acquire(timeout=5)
    checkpointer.note_commit()
    assert connection.called.acquire(timeout=5)
    checkpointer.close()
    assert len(connection.statements) == 2
    assert checkpointer.checkpoints == 1
    assert connection.closed


def test_a_connection_that_did_not_open_is_opened_at_the_next_commit(tmp_path: Path) -> None:
    connection = Recording()
    connects = Connects(connection, failures=1)
    checkpointer = Checkpointer(connects, tmp_path / "log.sqlite")
    checkpointer.note_commit()
    assert not connection.called.acquire(timeout=0.3)
    assert connects.calls == 1
    checkpointer.note_commit()
    assert connection.called.acquire(timeout=5)
    checkpointer.close()
    assert connects.calls == 2
    assert checkpointer.checkpoints == 1
    assert connection.closed


def test_a_thread_that_does_not_start_is_started_at_the_next_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = Recording()
    checkpointer = started(connection, tmp_path)
    start = checkpointer._thread.start

    def fails() -> None:
        monkeypatch.setattr(checkpointer._thread, "start", start)
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(checkpointer._thread, "start", fails)
    checkpointer.note_commit()
    assert checkpointer._thread.ident is None
    checkpointer.note_commit()
    assert connection.called.acquire(timeout=5)
    checkpointer.close()
    assert checkpointer.checkpoints == 1


def test_close_stops_the_thread_at_once_and_closes_the_connection(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    connection = sqlite3.connect(path, check_same_thread=False)
    connection.execute("PRAGMA journal_mode = WAL")
    checkpointer = Checkpointer(lambda: connection, path)
    checkpointer.note_commit()
    assert eventually(lambda: checkpointer.checkpoints == 1, 5)
    begun = time.monotonic()
    checkpointer.close()
    assert time.monotonic() - begun < 1
    assert not checkpointer._thread.is_alive()
    with pytest.raises(sqlite3.ProgrammingError):
        connection.execute("SELECT 1")


def rows_in_database_file(path: Path) -> int | None:
    """Rows of the events table in the database file alone, not its WAL (None if the
    file does not read as it is, say mid-checkpoint)."""
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            (count,) = connection.execute("SELECT count(*) FROM events").fetchone()
        finally:
            connection.close()
    except sqlite3.Error:
        return None
    return int(count)


@pytest.mark.anyio
async def test_committed_events_reach_the_database_file_while_the_log_is_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.sqlite"
    async with SqliteLog(path) as log:
        for index in range(50):
            await log.append(run(f"s{index}", 1, 20), expected_seq=0)
        checkpointer = log._writer._checkpointer
        # The thread counts a checkpoint after the copy it made is visible in the file.
        assert await anyio.to_thread.run_sync(
            eventually,
            lambda: rows_in_database_file(path) == 1000 and checkpointer.checkpoints >= 1,
            10,
        )
        (pages,) = log._writer._connection.execute("PRAGMA wal_autocheckpoint").fetchone()
        assert pages == WRITER_CHECKPOINT_PAGES
    assert not checkpointer._thread.is_alive()
