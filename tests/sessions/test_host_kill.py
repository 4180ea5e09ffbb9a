"""A real `kill -9` of a worker in the middle of 50 sessions on one SQLite log; a second
worker on the same file must finish them all, losing and duplicating nothing."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import anyio

from tests.sessions import host_worker
from tests.sessions.host_worker import answer_for, check_log, steps_for
from turnkeeper.events import Envelope, ToolCalled, ToolMayHaveRun
from turnkeeper.logs import SqliteLog

SESSIONS = 50
# Killed once this many events are logged: every session has started, none is near done
# (a session logs 2 events to start and 4 per step).
KILL_AFTER = 300
WORKER = Path(host_worker.__file__)


def logged_events(path: Path) -> int:
    """Events in the worker's SQLite file so far, read as another process would."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            (count,) = connection.execute("SELECT count(*) FROM events").fetchone()
    except sqlite3.OperationalError:
        return 0  # not created yet
    return int(count)


def start_worker(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(path), str(SESSIONS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def read_logs(path: Path) -> dict[str, list[Envelope]]:
    async with SqliteLog(path) as log:
        return {session_id: await log.read(session_id) for session_id in await log.sessions()}


def test_kill_9_mid_run_then_a_new_worker_finishes_every_session(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    first = start_worker(path)
    try:
        deadline = time.monotonic() + 20
        while logged_events(path) < KILL_AFTER:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the worker logged too little in 20 s"
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.communicate()
    assert first.returncode == -signal.SIGKILL

    at_kill = anyio.run(read_logs, path)
    finished = [s for s, events in at_kill.items() if check_log(events).status == "idle"]
    unfinished = SESSIONS - len(finished)
    assert unfinished > 0, "the kill came too late: every session had finished"

    second = start_worker(path)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert out.split() == ["started", "finished"]

    final = anyio.run(read_logs, path)
    assert sorted(final) == sorted(f"s{index}" for index in range(SESSIONS))
    rerun_calls = redone_polls = 0
    for index in range(SESSIONS):
        session_id = f"s{index}"
        events = final[session_id]
        state = check_log(events)
        assert state.status == "idle"
        assert state.history[-1]["content"] == answer_for(steps_for(index))
        before = at_kill.get(session_id, [])
        # Nothing logged before the kill was lost or changed.
        assert events[: len(before)] == before
        if before and before[-1].type == "local.tool_call":
            # Logged, maybe run, never answered: the new worker ran it again, saying so.
            called = before[-1].event
            assert isinstance(called, ToolCalled)
            assert events[len(before)].event == ToolMayHaveRun(called.tool_call_id, called.name)
            assert events[len(before) + 1].event == called
            rerun_calls += 1
        if before and check_log(before).in_poll:
            # A model call was in flight: the new worker made it again.
            assert events[len(before)].type == "local.model_response"
            redone_polls += 1
    print(
        f"killed with {unfinished} of {SESSIONS} sessions unfinished; the new worker re-ran "
        f"{rerun_calls} tool calls and {redone_polls} model calls that were in flight"
    )
