"""Logs named on the command line: reading leaves a log to its writer, recording needs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.logs.test_logs import envelope, run
from turnkeeper.cli._logs import Recorder, load_log
from turnkeeper.core import LogError
from turnkeeper.logs import JsonlLog, SqliteLog


def names(directory: Path) -> list[str]:
    """The names of the entries in `directory`."""
    return sorted(path.name for path in directory.iterdir())


@pytest.mark.anyio
async def test_reading_a_sqlite_log_takes_no_lock_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    async with SqliteLog(path) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
    (tmp_path / "runs.db-writer.lock").unlink()
    before = path.read_bytes()
    loaded = await load_log(str(path))
    assert loaded.sessions == {"s1": tuple(run("s1", 1, 2))}
    assert path.read_bytes() == before
    assert "runs.db-writer.lock" not in names(tmp_path)


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["runs.db", "runs"])
async def test_a_log_is_read_while_a_writer_holds_it_and_stays_the_writers(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    writer = JsonlLog(path) if name == "runs" else SqliteLog(path)
    async with writer:
        await writer.append(run("s1", 1, 2), expected_seq=0)
        loaded = await load_log(str(path))
        assert loaded.sessions == {"s1": tuple(run("s1", 1, 2))}
        await writer.append([envelope("s1", 3)], expected_seq=2)
        assert (await load_log(str(path))).sessions == {"s1": tuple(run("s1", 1, 3))}


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["runs.db", "runs"])
async def test_recording_to_a_log_another_writer_holds_is_refused_at_once(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    writer = JsonlLog(path) if name == "runs" else SqliteLog(path)
    async with writer:
        await writer.append(run("s1", 1, 1), expected_seq=0)
        refused = f"--log {path}: this log is not written here: another log writes it"
        with pytest.raises(LogError, match=refused):
            async with Recorder(str(path)):
                pass
        await writer.append([envelope("s1", 2)], expected_seq=1)
    async with Recorder(str(path)) as recorder:
        await recorder.record(envelope("s2", 1))
    assert (await load_log(str(path))).sessions == {
        "s1": tuple(run("s1", 1, 2)),
        "s2": (envelope("s2", 1),),
    }


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["runs.sqlite", "runs.jsonl", "runs"])
async def test_recording_makes_the_folders_of_a_new_log(tmp_path: Path, name: str) -> None:
    path = tmp_path / "new" / "deeper" / name
    async with Recorder(str(path)) as recorder:
        for event in run("s1", 1, 2):
            await recorder.record(event)
    assert (await load_log(str(path))).sessions["s1"] == tuple(run("s1", 1, 2))
