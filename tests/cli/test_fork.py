"""`turnkeeper fork`, run as a command: the fork is written into the log it names (a
SQLite file, a JsonlLog directory, a .jsonl file) and a Host on that log goes on with
it; bad forks exit 2 naming what is wrong and write nothing."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.cli.test_check import lookup, session
from tests.cli.test_main import cli
from tests.logs.test_sqlite_log import damage_page_header
from turnkeeper.events import Envelope, Forked
from turnkeeper.logs import EventLog, JsonlLog, SqliteLog, encode_jsonl, read_jsonl
from turnkeeper.providers import ScriptedChat, text_response
from turnkeeper.sessions import Host
from turnkeeper.state import replay


def written(kind: str, path: Path) -> EventLog:
    return SqliteLog(path) if kind == "sqlite" else JsonlLog(path)


async def record(kind: str, path: Path) -> list[Envelope]:
    events = await session("origin")
    if kind == "jsonl":
        await anyio.Path(path).write_bytes(encode_jsonl(events))
    else:
        async with written(kind, path) as log:
            await log.append(events, expected_seq=0)
    return events


async def read(kind: str, path: Path, session_id: str) -> list[Envelope]:
    if kind == "jsonl":
        read = await anyio.to_thread.run_sync(read_jsonl, path)
        return [e for e in read.events if e.session_id == session_id]
    async with written(kind, path) as log:
        return await log.read(session_id)


@pytest.mark.parametrize(
    ("kind", "name"), [("sqlite", "a.sqlite"), ("dir", "a"), ("jsonl", "a.jsonl")]
)
def test_a_fork_is_written_into_the_log(tmp_path: Path, kind: str, name: str) -> None:
    path = tmp_path / name
    origin = anyio.run(record, kind, path)
    done = cli("fork", str(path), "origin", "6", "--new-id", "copy", cwd=tmp_path)
    assert done.code == 0, done.err
    assert done.out == "copy\n"
    assert "forked session origin at seq 6 as copy (running)" in done.err
    events = anyio.run(read, kind, path, "copy")
    assert [e.event for e in events[:6]] == [e.event for e in origin[:6]]
    assert events[6].event == Forked(origin="origin", at_seq=6)
    assert anyio.run(read, kind, path, "origin") == origin
    assert replay(events).status == "running"
    generated = cli("fork", str(path), "origin", "15", cwd=tmp_path)
    assert generated.code == 0, generated.err
    assert generated.out.startswith("local_")


def test_a_host_on_the_log_goes_on_with_the_fork(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    anyio.run(record, "sqlite", path)
    assert cli("fork", str(path), "origin", "6", "--new-id", "copy", cwd=tmp_path).code == 0

    async def resume() -> str | None:
        chat = ScriptedChat([text_response("the fork's own answer")])
        async with (
            SqliteLog(path) as log,
            Host(chat=chat, log=log, tools={"lookup": lookup}) as host,
        ):
            with anyio.fail_after(10):
                return (await host.result("copy", wait=10)).text

    assert anyio.run(resume) == "the fork's own answer"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["origin", "99"], "at_seq: expected an integer from 1 to 15"),
        (["origin", "0"], "expected a positive integer"),
        (["nobody", "3"], "holds no session 'nobody'"),
        (["origin", "3", "--new-id", "origin"], "--new-id: "),
    ],
)
def test_a_bad_fork_exits_2_and_writes_nothing(tmp_path: Path, args: list[str], words: str) -> None:
    path = tmp_path / "a.sqlite"
    anyio.run(record, "sqlite", path)
    done = cli("fork", str(path), *args, cwd=tmp_path)
    assert done.code == 2
    assert words in done.err
    assert done.out == ""

    async def sessions() -> list[str]:
        async with SqliteLog(path) as log:
            return await log.sessions()

    assert anyio.run(sessions) == ["origin"]


def test_a_log_another_process_writes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    anyio.run(record, "sqlite", path)

    async def while_written() -> tuple[int, str]:
        async with SqliteLog(path):
            done = await anyio.to_thread.run_sync(
                lambda: cli("fork", str(path), "origin", "6", cwd=tmp_path)
            )
            return done.code, done.err

    code, err = anyio.run(while_written)
    assert code == 2
    assert "this log is not written here: another log writes it" in err


def test_a_log_not_written_for_another_reason_is_refused_saying_that_reason(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.sqlite"
    anyio.run(record, "sqlite", path)
    # Damage that quick_check finds and reads do not: the file opens for reading only.
    damage_page_header(path, "sessions")
    done = cli("fork", str(path), "origin", "6", cwd=tmp_path)
    assert done.code == 2
    assert "this log is not written here: SQLite's quick_check finds it damaged" in done.err
    assert "another log" not in done.err
