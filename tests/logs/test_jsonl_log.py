"""JsonlLog's own behaviour: torn lines, repair, corrupt files, file names and the order file."""

from __future__ import annotations

import errno
import gc
import itertools
import json
import os
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.logs.test_logs import envelope, run
from turnkeeper.core import LogCorrupt, LogError, SeqError
from turnkeeper.events import Envelope
from turnkeeper.logs import _jsonl_log as jsonl_log
from turnkeeper.logs._jsonl import decode_jsonl, encode_jsonl
from turnkeeper.logs._jsonl_log import JsonlLog


def names(directory: Path) -> list[str]:
    """The names of the entries in `directory`."""
    return sorted(path.name for path in directory.iterdir())


async def write_sessions(directory: Path, sessions: dict[str, int]) -> None:
    """Log `count` events for each session, one append each, then close."""
    async with JsonlLog(directory) as log:
        for session_id, count in sessions.items():
            await log.append(run(session_id, 1, count), expected_seq=0)


@pytest.mark.anyio
async def test_torn_last_line_is_reported_skipped_and_repaired_before_the_next_append(
    tmp_path: Path,
) -> None:
    await write_sessions(tmp_path, {"s1": 3})
    path = tmp_path / "s1.jsonl"
    with path.open("ab") as file:
        file.write(b'{"session_id":"s1","seq":4,"at":4.0,"event":{"type":"local.us')

    with structlog.testing.capture_logs() as logged:
        async with JsonlLog(tmp_path) as log:
            assert await log.read("s1") == run("s1", 1, 3)
            assert log.torn["s1"].line == 4
            assert b'"seq":4' in log.torn["s1"].data
            await log.append([envelope("s1", 4)], expected_seq=3)
    assert [entry["event"] for entry in logged] == ["jsonl log: torn last line skipped"]
    assert logged[0]["session_id"] == "s1"
    assert logged[0]["line"] == 4

    repaired = decode_jsonl(path.read_bytes())
    assert repaired.torn is None
    assert list(repaired.events) == run("s1", 1, 4)
    async with JsonlLog(tmp_path) as log:
        assert log.torn == {}
        assert await log.read("s1") == run("s1", 1, 4)


@pytest.mark.anyio
async def test_a_file_holding_only_a_torn_first_line_is_an_empty_session(tmp_path: Path) -> None:
    (tmp_path / "s1.jsonl").write_bytes(b'{"session_id":"s1","se')
    async with JsonlLog(tmp_path) as log:
        assert await log.sessions() == []
        assert await log.last_seq("s1") == 0
        await log.append(run("s1", 1, 2), expected_seq=0)
    assert decode_jsonl((tmp_path / "s1.jsonl").read_bytes()).events == tuple(run("s1", 1, 2))


@pytest.mark.anyio
async def test_a_whole_last_line_without_its_newline_is_kept_and_terminated(
    tmp_path: Path,
) -> None:
    (tmp_path / "s1.jsonl").write_bytes(encode_jsonl(run("s1", 1, 2)).rstrip(b"\n"))
    async with JsonlLog(tmp_path) as log:
        assert await log.read("s1") == run("s1", 1, 2)
        assert log.torn == {}
        await log.append([envelope("s1", 3)], expected_seq=2)
    data = (tmp_path / "s1.jsonl").read_bytes()
    assert data == encode_jsonl(run("s1", 1, 3))


@pytest.mark.anyio
async def test_bytes_left_by_a_failed_append_are_cut_before_the_next_one(tmp_path: Path) -> None:
    async with JsonlLog(tmp_path) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
        with (tmp_path / "s1.jsonl").open("ab") as file:
            file.write(b'{"session_id":"s1","seq":3,')
        await log.append([envelope("s1", 3)], expected_seq=2)
    assert (tmp_path / "s1.jsonl").read_bytes() == encode_jsonl(run("s1", 1, 3))


class DiskFillsUp:
    """`os` for the JSONL log, whose disk takes `room` more bytes, then is full."""

    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, fd: int, data: memoryview) -> int:
        if not self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = min(self.room, len(data))
        self.room -= taken
        return os.write(fd, data[:taken])

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@pytest.mark.anyio
async def test_an_append_the_disk_cuts_short_leaves_nothing_to_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with JsonlLog(tmp_path) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
        monkeypatch.setattr(jsonl_log, "os", DiskFillsUp(room=len(encode_jsonl(run("s1", 3, 2)))))
        with pytest.raises(LogError, match=r"cannot append: .*No space left on device"):
            await log.append(run("s1", 3, 3), expected_seq=2)
        monkeypatch.undo()
        assert await log.last_seq("s1") == 2
    assert (tmp_path / "s1.jsonl").read_bytes() == encode_jsonl(run("s1", 1, 2))
    async with JsonlLog(tmp_path) as log:
        assert await log.read("s1") == run("s1", 1, 2)


@pytest.mark.anyio
async def test_a_corrupt_middle_line_names_file_session_line_and_seq(tmp_path: Path) -> None:
    lines = encode_jsonl(run("s1", 1, 4)).split(b"\n")
    lines[2] = b'{"session_id":"s1","seq":3,"at":"soon"}'
    path = tmp_path / "s1.jsonl"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(
        LogCorrupt, match=r"s1\.jsonl \(session s1\), line 3: .*\(after seq 2\)"
    ) as info:
        await JsonlLog(tmp_path).read("s1")
    assert info.value.line == 3
    assert str(path) in str(info.value)


@pytest.mark.anyio
async def test_a_seq_gap_in_a_file_names_file_session_and_seq(tmp_path: Path) -> None:
    events = run("s1", 1, 2) + run("s1", 4, 1)
    (tmp_path / "s1.jsonl").write_bytes(encode_jsonl(events))
    with pytest.raises(SeqError, match=r"s1\.jsonl: session s1: seq 4 .*expected seq 3") as info:
        await JsonlLog(tmp_path).read("s1")
    assert (info.value.session_id, info.value.seq, info.value.expected) == ("s1", 4, 3)


@pytest.mark.anyio
async def test_another_sessions_event_in_a_file_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "s1.jsonl").write_bytes(encode_jsonl([envelope("s1", 1), envelope("s2", 2)]))
    with pytest.raises(
        LogCorrupt, match=r"s1\.jsonl \(session s1\): seq 2 belongs to session 's2'"
    ):
        await JsonlLog(tmp_path).read("s1")


@pytest.mark.anyio
async def test_a_damaged_session_file_leaves_the_other_sessions_as_they_are(
    tmp_path: Path,
) -> None:
    await write_sessions(tmp_path, {"a": 2, "b": 3, "c": 1})
    damaged = tmp_path / "b.jsonl"
    lines = damaged.read_bytes().split(b"\n")
    lines[1] = b"not an envelope"
    damaged.write_bytes(b"\n".join(lines))
    async with JsonlLog(tmp_path) as log:
        assert await log.sessions() == ["a", "c", "b"]
        for call in (
            log.read("b"),
            log.last_seq("b"),
            log.read_all(),
            log.append([envelope("b", 4)], expected_seq=3),
        ):
            with pytest.raises(LogCorrupt, match=r"b\.jsonl \(session b\), line 2"):
                await call
        assert await log.read("a") == run("a", 1, 2)
        await log.append([envelope("a", 3)], expected_seq=2)
        await log.append(run("d", 1, 1), expected_seq=0)
    assert damaged.read_bytes() == b"\n".join(lines)
    async with JsonlLog(tmp_path) as log:
        assert await log.read("a") == run("a", 1, 3)
        assert await log.read("d") == run("d", 1, 1)
        with pytest.raises(LogCorrupt):
            await log.read("b")


@pytest.mark.anyio
async def test_a_log_file_whose_name_is_not_a_session_id_is_refused(tmp_path: Path) -> None:
    (tmp_path / "two words.jsonl").write_bytes(b"")
    with pytest.raises(LogCorrupt, match=r"two words\.jsonl: not a session log"):
        await JsonlLog(tmp_path).sessions()


@pytest.mark.parametrize(
    "session_id", ["../escape", "a/b", ".hidden", "-dash", "a b", "x" * 201, "é", "a\x00b"]
)
@pytest.mark.anyio
async def test_session_ids_that_cannot_be_file_names_are_refused(
    tmp_path: Path, session_id: str
) -> None:
    directory = tmp_path / "log"
    async with JsonlLog(directory) as log:
        with pytest.raises(LogError, match="cannot name a log file"):
            await log.append([envelope(session_id, 1)], expected_seq=0)
        assert await log.read(session_id) == []
    assert names(tmp_path) == ["log"]
    assert names(directory) == ["writer.lock"]


@pytest.mark.anyio
async def test_a_second_log_on_a_directory_only_reads_it(tmp_path: Path) -> None:
    async with JsonlLog(tmp_path) as writer:
        await writer.append(run("s1", 1, 2), expected_seq=0)
        async with JsonlLog(tmp_path) as reader:
            assert await reader.read("s1") == run("s1", 1, 2)
            with pytest.raises(LogError, match="this log only reads the directory"):
                await reader.append([envelope("s1", 3)], expected_seq=2)
            with pytest.raises(LogError, match="this log only reads the directory"):
                await reader.append(run("s2", 1, 1), expected_seq=0)
        await writer.append([envelope("s1", 3)], expected_seq=2)
    # Once the writer has closed, the next log to open writes.
    async with JsonlLog(tmp_path) as log:
        await log.append([envelope("s1", 4)], expected_seq=3)
        assert await log.read("s1") == run("s1", 1, 4)
    assert (tmp_path / "s1.jsonl").read_bytes() == encode_jsonl(run("s1", 1, 4))


@pytest.mark.anyio
async def test_a_directory_path_that_is_a_file_is_a_log_error(tmp_path: Path) -> None:
    (tmp_path / "log").write_bytes(b"not a directory")
    with pytest.raises(LogError, match="cannot open the log directory"):
        await JsonlLog(tmp_path / "log").sessions()


@pytest.mark.anyio
async def test_positions_follow_append_order_across_reopen_even_when_time_goes_back(
    tmp_path: Path,
) -> None:
    async with JsonlLog(tmp_path) as log:
        await log.append([envelope("b", 1, at=50.0)], expected_seq=0)
        await log.append([envelope("a", 1, at=10.0)], expected_seq=0)
        await log.append([envelope("b", 2, at=5.0)], expected_seq=1)
        live = await log.read_all()
    assert [(e.session_id, e.seq) for _, e in live] == [("b", 1), ("a", 1), ("b", 2)]
    async with JsonlLog(tmp_path) as log:
        assert await log.read_all() == live
        assert await log.sessions() == ["b", "a"]


@pytest.mark.anyio
async def test_without_an_order_file_events_are_ranked_by_time_and_the_order_is_rewritten(
    tmp_path: Path,
) -> None:
    (tmp_path / "b.jsonl").write_bytes(encode_jsonl([envelope("b", 1, at=1.0)]))
    (tmp_path / "a.jsonl").write_bytes(
        encode_jsonl([envelope("a", 1, at=2.0), envelope("a", 2, at=0.5)])
    )
    async with JsonlLog(tmp_path) as log:
        ranked = await log.read_all()
        # a#2's clock went back: it still follows a#1, at a#1's time.
        assert [(e.session_id, e.seq) for _, e in ranked] == [("b", 1), ("a", 1), ("a", 2)]
        # Rewritten on opening, so a log opened beside this one places the same events.
        assert (tmp_path / "order.idx").read_bytes() == b"b 1\na 2\n"
        await log.append([envelope("b", 2, at=0.1)], expected_seq=1)
        live = await log.read_all()
    assert (tmp_path / "order.idx").read_bytes() == b"b 1\na 2\nb 2\n"
    async with JsonlLog(tmp_path) as log:
        assert await log.read_all() == live


@pytest.mark.anyio
async def test_a_torn_order_entry_is_dropped_and_its_events_are_ranked(tmp_path: Path) -> None:
    await write_sessions(tmp_path, {"a": 1, "b": 1})
    (tmp_path / "order.idx").write_bytes(b"a 1\nb")
    async with JsonlLog(tmp_path) as log:
        assert [(e.session_id, e.seq) for _, e in await log.read_all()] == [("a", 1), ("b", 1)]


@pytest.mark.anyio
async def test_a_corrupt_order_entry_is_a_log_corrupt_naming_its_line(tmp_path: Path) -> None:
    await write_sessions(tmp_path, {"a": 1})
    (tmp_path / "order.idx").write_bytes(b"a 1\n??\na 1\n")
    with pytest.raises(LogCorrupt, match=r"line 2: .*order\.idx: not an order entry"):
        await JsonlLog(tmp_path).read_all()


@pytest.mark.anyio
async def test_close_waits_for_an_append_queued_behind_its_session(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path)

    async def append(
        events: list[Envelope], expected_seq: int, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        task_status.started()
        await log.append(events, expected_seq=expected_seq)

    await log.sessions()
    async with anyio.create_task_group() as group:
        await group.start(append, run("s1", 1, 2), 0)
        await group.start(append, run("s1", 3, 1), 2)
        await log.close()
    async with JsonlLog(tmp_path) as reopened:
        assert await reopened.read("s1") == run("s1", 1, 3)


_counter = itertools.count()


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    encode_jsonl([envelope("s1", 1)]),
                    encode_jsonl([envelope("s1", 2)]),
                    encode_jsonl([envelope("s2", 1)]),
                    b"\n",
                    b"{",
                    b'{"session_id":"s1"}\n',
                    b"\xff\xfe",
                    b"[]\n",
                ]
            ),
            max_size=6,
        ).map(b"".join),
    ),
    order=st.one_of(st.just(b""), st.binary(max_size=40), st.just(b"s1 1\ns1 9\nzz 1\n")),
)
@pytest.mark.anyio
async def test_any_bytes_in_a_log_directory_raise_only_log_errors(
    tmp_path: Path, data: bytes, order: bytes
) -> None:
    directory = tmp_path / str(next(_counter))
    directory.mkdir()
    (directory / "s1.jsonl").write_bytes(data)
    (directory / "order.idx").write_bytes(order)
    try:
        async with JsonlLog(directory) as log:
            events = await log.read("s1")
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert [e for _, e in await log.read_all()] == events
            await log.append([envelope("s1", len(events) + 1)], expected_seq=len(events))
        async with JsonlLog(directory) as log:
            assert await log.read("s1") == [*events, envelope("s1", len(events) + 1)]
    except LogError:
        pass


@pytest.mark.anyio
async def test_opening_leaves_the_collector_as_it_found_it(tmp_path: Path) -> None:
    await write_sessions(tmp_path, {"a": 3, "b": 1, "c": 1, "d": 2})
    async with JsonlLog(tmp_path) as log:
        assert gc.isenabled()
        assert [(e.session_id, e.seq) for _, e in await log.read_all()] == [
            ("a", 1),
            ("a", 2),
            ("a", 3),
            ("b", 1),
            ("c", 1),
            ("d", 1),
            ("d", 2),
        ]
    gc.disable()
    try:
        async with JsonlLog(tmp_path) as log:
            assert len(await log.read_all()) == 7
            assert not gc.isenabled()
    finally:
        gc.enable()
    (tmp_path / "c.jsonl").write_bytes(b"not json\n")
    with pytest.raises(LogCorrupt, match=r"c\.jsonl"):
        await JsonlLog(tmp_path).read("c")
    assert gc.isenabled()
    (tmp_path / "not a session.jsonl").write_bytes(b"")
    with pytest.raises(LogCorrupt, match=r"not a session log"):
        await JsonlLog(tmp_path).sessions()
    assert gc.isenabled()


@pytest.mark.anyio
async def test_an_open_cancelled_after_taking_the_lock_releases_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taking = threading.Event()
    taken = threading.Event()
    real_lock = jsonl_log._lock

    def slow_lock(directory: Path, read_only: bool) -> jsonl_log._Lock:
        taking.set()
        taken.wait()
        return real_lock(directory, read_only)

    monkeypatch.setattr(jsonl_log, "_lock", slow_lock)
    log = JsonlLog(tmp_path)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(log.sessions)
            assert await anyio.to_thread.run_sync(taking.wait, 10)
            scope.cancel()
            # The thread finishes taking the lock after the cancel.
            taken.set()
    monkeypatch.setattr(jsonl_log, "_lock", real_lock)
    # Neither this log, opened again, nor another one is left only reading the directory.
    await log.append(run("a", 1, 1), expected_seq=0)
    await log.close()
    async with JsonlLog(tmp_path) as other:
        await other.append([envelope("a", 2)], expected_seq=1)
        assert await other.read("a") == run("a", 1, 2)


@pytest.mark.anyio
async def test_an_open_that_fails_releases_the_lock(tmp_path: Path) -> None:
    await write_sessions(tmp_path, {"a": 1})
    (tmp_path / "order.idx").write_bytes(b"??\n")
    log = JsonlLog(tmp_path)
    with pytest.raises(LogCorrupt, match="not an order entry"):
        await log.sessions()
    (tmp_path / "order.idx").write_bytes(b"a 1\n")
    await log.append([envelope("a", 2)], expected_seq=1)
    await log.close()
    async with JsonlLog(tmp_path) as other:
        await other.append([envelope("a", 3)], expected_seq=2)


@pytest.mark.anyio
async def test_a_reader_beside_a_writer_holds_no_append_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = anyio.Event()
    release = threading.Event()
    real_write = jsonl_log._write

    def held_write(path: Path, data: bytes, tail: Any, new_session: bool) -> int:
        size = real_write(path, data, tail, new_session)
        if path.name == "b.jsonl":
            anyio.from_thread.run_sync(written.set)
            release.wait()
        return size

    monkeypatch.setattr(jsonl_log, "_write", held_write)
    async with JsonlLog(tmp_path) as writer, anyio.create_task_group() as group:
        await writer.append(run("a", 1, 1), expected_seq=0)
        group.start_soon(partial(writer.append, run("b", 1, 1), expected_seq=0))
        await written.wait()
        # b#1 is in its file, but its append has not returned: no reader has it yet.
        async with JsonlLog(tmp_path) as reader:
            assert [(p, e.session_id) for p, e in await reader.read_all()] == [(1, "a")]
            assert await reader.read("b") == []
            assert await reader.sessions() == ["a"]
            assert reader.torn == {}
        release.set()
    async with JsonlLog(tmp_path) as reader:
        assert [(p, e.session_id) for p, e in await reader.read_all()] == [(1, "a"), (2, "b")]


@pytest.mark.anyio
async def test_a_reader_reads_again_the_files_the_order_file_finds_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_load_order = jsonl_log._load_order

    async with JsonlLog(tmp_path) as writer:
        await writer.append(run("a", 1, 1), expected_seq=0)

        async def append_more() -> None:
            await writer.append(run("b", 1, 1), expected_seq=0)
            await writer.append([envelope("a", 2)], expected_seq=1)

        def load_order_later(path: Path) -> tuple[tuple[tuple[str, int], ...], bool]:
            # The reader has read the session files; the writer appends before the order.
            anyio.from_thread.run(append_more)
            return real_load_order(path)

        monkeypatch.setattr(jsonl_log, "_load_order", load_order_later)
        async with JsonlLog(tmp_path) as reader:
            # b#1 and a#2 are in no file the reader read first; it reads them again, and
            # places them as the writer did.
            placed = await reader.read_all()
        monkeypatch.setattr(jsonl_log, "_load_order", real_load_order)
        expected = await writer.read_all()
    assert placed == expected
    assert [(p, e.session_id, e.seq) for p, e in expected] == [
        (1, "a", 1),
        (2, "b", 1),
        (3, "a", 2),
    ]


@pytest.mark.anyio
async def test_readers_opened_while_a_writer_appends_each_hold_a_prefix_of_its_order(
    tmp_path: Path,
) -> None:
    snapshots: list[list[tuple[int, str, int]]] = []
    done = False

    async def append_sessions(first: int) -> None:
        for seq in range(1, 21):
            for index in range(first, first + 5):
                await writer.append([envelope(f"s{index}", seq)], expected_seq=seq - 1)

    async def read_repeatedly() -> None:
        while not done:
            async with JsonlLog(tmp_path) as reader:
                snapshots.append([(p, e.session_id, e.seq) for p, e in await reader.read_all()])

    async with JsonlLog(tmp_path) as writer:
        async with anyio.create_task_group() as readers:
            readers.start_soon(read_repeatedly)
            async with anyio.create_task_group() as group:
                for first in range(0, 20, 5):
                    group.start_soon(append_sessions, first)
            done = True
        final = [(p, e.session_id, e.seq) for p, e in await writer.read_all()]
    assert len(final) == 400
    assert len(snapshots) > 1
    for snapshot in snapshots:
        assert snapshot == final[: len(snapshot)]


@pytest.mark.anyio
async def test_an_order_file_that_cannot_be_written_loses_no_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.jsonl").write_bytes(encode_jsonl(run("a", 1, 1)))
    real_replace = jsonl_log._replace_order

    def failing_replace(path: Path, events: list[Envelope], damaged: dict[str, int]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonl_log, "_replace_order", failing_replace)
    with structlog.testing.capture_logs() as logged:
        async with JsonlLog(tmp_path) as writer:
            await writer.append([envelope("a", 2)], expected_seq=1)
            await writer.append(run("b", 1, 1), expected_seq=0)
            assert [(e.session_id, e.seq) for _, e in await writer.read_all()] == [
                ("a", 1),
                ("a", 2),
                ("b", 1),
            ]
            # The order file does not place them, so a reader beside the writer has none.
            async with JsonlLog(tmp_path) as reader:
                assert await reader.read_all() == []
            monkeypatch.setattr(jsonl_log, "_replace_order", real_replace)
            await writer.append([envelope("b", 2)], expected_seq=1)
            live = await writer.read_all()
            async with JsonlLog(tmp_path) as reader:
                assert await reader.read_all() == live
    assert [entry["event"] for entry in logged] == ["jsonl log: cannot rewrite the order file"] * 3
    async with JsonlLog(tmp_path) as log:
        assert await log.read_all() == live


@pytest.mark.anyio
async def test_a_read_only_log_leaves_the_directory_to_a_writer_opened_after_it(
    tmp_path: Path,
) -> None:
    await write_sessions(tmp_path, {"a": 2})
    async with JsonlLog(tmp_path, read_only=True) as reader:
        assert await reader.read("a") == run("a", 1, 2)
        with pytest.raises(LogError, match="only reads the directory: it was opened read_only"):
            await reader.append([envelope("a", 3)], expected_seq=2)
        async with JsonlLog(tmp_path) as writer:
            await writer.append([envelope("a", 3)], expected_seq=2)
            async with JsonlLog(tmp_path, read_only=True) as beside:
                assert [e for _, e in await beside.read_all()] == run("a", 1, 3)
    assert repr(reader) == f"JsonlLog({str(tmp_path)!r}, read_only=True)"


@pytest.mark.anyio
async def test_a_read_only_log_of_a_missing_directory_makes_none(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no log directory there"):
        await JsonlLog(tmp_path / "missing", read_only=True).sessions()
    assert names(tmp_path) == []


def cut_lines(path: Path, keep: int) -> None:
    """Keep the first `keep` lines of the file, whole: damage no line shows."""
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:keep]))


@pytest.mark.anyio
async def test_a_session_file_holding_less_than_the_order_file_records_is_damaged(
    tmp_path: Path,
) -> None:
    # As the SQLite log's index damage did: a session read back as 3 events of 15.
    await write_sessions(tmp_path, {"a": 2, "b": 15, "c": 1})
    cut_lines(tmp_path / "b.jsonl", 3)
    short = (
        f"{tmp_path / 'b.jsonl'} (session b) holds 3 events, but the order file records "
        f"seq 15 of it (a damaged log? see: turnkeeper check {tmp_path})"
    )
    with structlog.testing.capture_logs() as logged:
        async with JsonlLog(tmp_path) as log:
            assert log.writable
            assert await log.sessions() == ["a", "c", "b"]
            for call in (
                log.read("b"),
                log.last_seq("b"),
                log.read_all(),
                log.append([envelope("b", 4)], expected_seq=3),
            ):
                with pytest.raises(LogCorrupt) as damaged:
                    await call
                assert str(damaged.value) == short
            assert await log.read("a") == run("a", 1, 2)
            await log.append([envelope("a", 3)], expected_seq=2)
    assert [entry["event"] for entry in logged] == ["jsonl log: session unreadable"]
    # The order file keeps what it records of the session: the damage is found again.
    for read_only in (False, True):
        async with JsonlLog(tmp_path, read_only=read_only) as log:
            with pytest.raises(LogCorrupt, match="holds 3 events, but the order file records"):
                await log.read("b")
            assert await log.read("a") == run("a", 1, 3)
            assert await log.read("c") == run("c", 1, 1)


@pytest.mark.anyio
async def test_a_session_file_gone_while_the_order_file_records_it_is_damaged(
    tmp_path: Path,
) -> None:
    await write_sessions(tmp_path, {"a": 2, "b": 2})
    (tmp_path / "b.jsonl").unlink()
    async with JsonlLog(tmp_path) as log:
        assert await log.sessions() == ["a", "b"]
        with pytest.raises(LogCorrupt) as gone:
            await log.read("b")
        assert str(gone.value) == (
            f"{tmp_path / 'b.jsonl'} (session b) is missing, but the order file records seq 2 "
            f"of it (a damaged log? see: turnkeeper check {tmp_path})"
        )
        assert await log.read("a") == run("a", 1, 2)


@pytest.mark.anyio
async def test_a_reader_beside_a_writer_finds_a_session_file_cut_short(tmp_path: Path) -> None:
    await write_sessions(tmp_path, {"a": 2, "b": 5})
    cut_lines(tmp_path / "b.jsonl", 2)
    # The writer took the lock before the damage was done, as a long-running host would.
    async with JsonlLog(tmp_path) as writer:
        await writer.append([envelope("a", 3)], expected_seq=2)
        async with JsonlLog(tmp_path, read_only=True) as reader:
            with pytest.raises(LogCorrupt, match="holds 2 events, but the order file records"):
                await reader.read("b")
            assert await reader.read("a") == run("a", 1, 3)


# Root writes a directory whatever its mode says: the check runs as root without the
# capabilities that let it ignore modes (setpriv, of util-linux), as any other user.
UNPRIVILEGED = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
)

READ_ONLY_DIRECTORY = """
import json, sys
import anyio
from turnkeeper.core import LogError
from turnkeeper.events import Envelope, MessageReceived
from turnkeeper.logs import JsonlLog
from turnkeeper.providers import ScriptedChat
from turnkeeper.sessions import Host

async def main() -> None:
    async with JsonlLog(sys.argv[1]) as log:
        seen = {
            "writable": log.writable,
            "because": log.read_only_because,
            "events": [e.seq for e in await log.read("s1")],
        }
        try:
            event = MessageReceived(text="new")
            await log.append([Envelope("s2", 1, 1.0, event)], expected_seq=0)
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
async def test_a_directory_this_process_cannot_write_is_not_writable(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    await write_sessions(directory, {"s1": 2})
    # Its writer lock is there, and writable: only the directory is not.
    directory.chmod(0o555)
    try:
        done = await anyio.run_process(
            [*UNPRIVILEGED, sys.executable, "-c", READ_ONLY_DIRECTORY, str(directory)],
            check=False,
        )
    finally:
        directory.chmod(0o755)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == {
        "writable": False,
        "because": "the directory is read-only here",
        "events": [1, 2],
        "append": f"{directory}: this log only reads the directory: the directory is "
        "read-only here",
        "host": f"Host: JsonlLog({str(directory)!r}) only reads (opened read_only, or another "
        "log writes it): a host must write its log",
    }


@pytest.mark.anyio
async def test_why_a_log_only_reads_its_directory(tmp_path: Path) -> None:
    async with JsonlLog(tmp_path) as writer:
        assert writer.read_only_because == ""
        async with JsonlLog(tmp_path) as second, JsonlLog(tmp_path, read_only=True) as reader:
            assert second.read_only_because == (
                f"another log writes it (it holds the writer lock {tmp_path / 'writer.lock'})"
            )
            assert reader.read_only_because == "it was opened read_only"


@pytest.mark.anyio
@pytest.mark.parametrize("damage", ["removed", "cut short"])
async def test_a_session_file_damaged_while_the_log_is_open_refuses_the_next_append(
    tmp_path: Path, damage: str
) -> None:
    async with JsonlLog(tmp_path) as log:
        await log.append(run("a", 1, 3), expected_seq=0)
        await log.append(run("b", 1, 2), expected_seq=0)
        path = tmp_path / "a.jsonl"
        if damage == "removed":
            path.unlink()
        else:
            os.truncate(path, 50)
        with pytest.raises(LogCorrupt, match=r"a\.jsonl: holds \d+ bytes, fewer than the"):
            await log.append([envelope("a", 4)], expected_seq=3)
        # Nothing was acknowledged, nothing is padded in, and the damage is the session's.
        with pytest.raises(LogCorrupt, match="fewer than the"):
            await log.read("a")
        assert b"\0" not in path.read_bytes()
        assert await log.read("b") == run("b", 1, 2)
        await log.append([envelope("b", 3)], expected_seq=2)
        assert sorted(await log.sessions()) == ["a", "b"]  # each once
    async with JsonlLog(tmp_path) as log:
        with pytest.raises(LogCorrupt):
            await log.read("a")
        assert await log.read("b") == [*run("b", 1, 2), envelope("b", 3)]
