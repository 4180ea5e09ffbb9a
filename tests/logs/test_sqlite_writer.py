"""The SQLite log's writer thread: rounds, settling on the event loop, cancellation."""

from __future__ import annotations

import itertools
import threading
from functools import partial
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.logs.test_logs import run
from turnkeeper.core import LogError
from turnkeeper.logs._log import Batch
from turnkeeper.logs._sqlite_log import SqliteLog

_counter = itertools.count()


class SlowCommits:
    """Stands in for the writer's `_commit`: each round waits until the test lets it go."""

    def __init__(self, commit: object) -> None:
        self.commit = commit
        self.go = threading.Semaphore(0)
        self.entered = threading.Semaphore(0)

    def __call__(self, batches: list[Batch]) -> list[LogError | None]:
        self.entered.release()
        self.go.acquire()
        assert callable(self.commit)
        outcome: list[LogError | None] = self.commit(batches)
        return outcome


# Each appender: how many ticks it waits before appending, and after how many ticks of
# waiting for its append it is cancelled (None: never).
appenders = st.lists(
    st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(0, 4))),
    min_size=1,
    max_size=24,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=appenders, releases=st.lists(st.integers(0, 3), min_size=1, max_size=12))
@pytest.mark.anyio
async def test_appends_cancelled_anywhere_are_all_or_nothing_and_never_strand_the_others(
    tmp_path: Path, plan: list[tuple[int, int | None]], releases: list[int]
) -> None:
    path = tmp_path / f"{next(_counter)}.db"
    outcomes: dict[str, str] = {}
    async with SqliteLog(path) as log:
        slow = SlowCommits(log._writer._commit)
        log._writer._commit = slow  # type: ignore[method-assign]

        async def append(session_id: str, delay: int, cancel_after: int | None) -> None:
            for _ in range(delay):
                await anyio.lowlevel.checkpoint()
            with anyio.CancelScope() as scope:
                if cancel_after is not None:
                    group.start_soon(cancel_later, scope, cancel_after)
                await log.append(run(session_id, 1, 2), expected_seq=0)
                outcomes[session_id] = "ok"
            if scope.cancelled_caught:
                outcomes[session_id] = "cancelled"

        async def cancel_later(scope: anyio.CancelScope, ticks: int) -> None:
            for _ in range(ticks):
                await anyio.lowlevel.checkpoint()
            scope.cancel()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                for index, (delay, cancel_after) in enumerate(plan):
                    group.start_soon(append, f"s{index}", delay, cancel_after)
                # Rounds are let go a few ticks apart, then all at once.
                for ticks in releases:
                    for _ in range(ticks):
                        await anyio.lowlevel.checkpoint()
                    slow.go.release()
                for _ in plan:
                    slow.go.release()
        for _ in range(len(plan) + 1):
            slow.go.release()
        for index, (_, cancel_after) in enumerate(plan):
            session_id = f"s{index}"
            events = await log.read(session_id)
            # Written whole or not at all; an append that returned is written.
            assert events in ([], run(session_id, 1, 2))
            if outcomes[session_id] == "ok":
                assert events == run(session_id, 1, 2)
            if cancel_after is None:
                assert outcomes[session_id] == "ok"
        # The log still takes appends: nothing was left waiting.
        await log.append(run("after", 1, 1), expected_seq=0)


@pytest.mark.anyio
async def test_a_round_commits_while_the_next_gathers(tmp_path: Path) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        slow = SlowCommits(log._writer._commit)
        log._writer._commit = slow  # type: ignore[method-assign]
        async with anyio.create_task_group() as group:
            group.start_soon(partial(log.append, run("first", 1, 1), expected_seq=0))
            await anyio.to_thread.run_sync(slow.entered.acquire)
            for index in range(50):
                group.start_soon(partial(log.append, run(f"s{index}", 1, 1), expected_seq=0))
            await anyio.wait_all_tasks_blocked()
            slow.go.release()
            slow.go.release()
        # One round held the first append; the fifty that came meanwhile shared the next.
        assert log.commits == 2


@pytest.mark.anyio
async def test_a_bug_in_a_commit_fails_its_appends_and_the_writer_goes_on(
    tmp_path: Path,
) -> None:
    async with SqliteLog(tmp_path / "log.db") as log:
        commit = log._writer._commit
        calls = 0

        def broken_once(batches: list[Batch]) -> list[LogError | None]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("boom")
            return commit(batches)

        log._writer._commit = broken_once  # type: ignore[method-assign]
        with pytest.raises(LogError, match="the writer failed: RuntimeError"):
            await log.append(run("s1", 1, 1), expected_seq=0)
        await log.append(run("s1", 1, 1), expected_seq=0)
        assert await log.read("s1") == run("s1", 1, 1)


@pytest.mark.anyio
async def test_closing_waits_for_appends_in_flight_and_stops_the_thread(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    await log.append(run("s0", 1, 1), expected_seq=0)
    writer = log._writer
    async with anyio.create_task_group() as group:
        for index in range(1, 20):
            group.start_soon(partial(log.append, run(f"s{index}", 1, 1), expected_seq=0))
        await anyio.lowlevel.checkpoint()
        await log.close()
    assert not writer._thread.is_alive()
    async with SqliteLog(tmp_path / "log.db") as reopened:
        assert len(await reopened.sessions()) == 20
