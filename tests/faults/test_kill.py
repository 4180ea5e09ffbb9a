"""The fault suite: a worker process (tests/faults/worker.py) hosting several hundred live
sessions on a SQLite file, and apart on a JsonlLog directory, is killed with SIGKILL at
random moments (the seed is printed), then started again on the same log, until its
sessions have finished. Then: nothing acknowledged is lost (every create, message and
tool result the driver heard back about is in the log), no session's seqs have a gap,
every tool call is answered, every session is finished, and every step call answered
really ran. Tools run at least once across crashes: how many calls ran more than once is
printed; that each run after the first had a `local.tool_call` of its own, marked
`local.tool_may_have_run` as one that may have run (`check_log`), is asserted."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.faults.worker import answer_for
from tests.sessions.host_worker import check_log
from turnkeeper.events import MessageQueued, MessageReceived, ToolCalled, ToolReturned
from turnkeeper.logs import EventLog, JsonlLog, SqliteLog

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 400
KILLS = 5
# One kill in four lands this long after the worker process starts (while it imports
# or recovers); the others this long after it is ready (while it takes the commands,
# or while the sessions run).
KILL_STARTING = (0.0, 1.5)
KILL_READY = (0.05, 1.5)
ROUND_TIMEOUT = 120.0


def plan(count: int) -> list[dict[str, Any]]:
    """The commands: each session created on a prompt of 1 to 3 steps, one in four asking
    the outside tool first (its result posted), one in two sent a second message."""
    commands: list[dict[str, Any]] = []
    for index in range(count):
        session_id = f"s{index}"
        prompt = f"take {1 + index % 3} steps {session_id}" + (" ask" if index % 4 == 0 else "")
        commands.append({"op": "create", "id": session_id, "prompt": prompt})
        if index % 4 == 0:
            commands.append(
                {"op": "results", "id": session_id, "call": "ask-1", "text": f"answer {index}"}
            )
        if index % 2 == 0:
            text = f"take 1 steps round {index}"
            commands.append({"op": "message", "id": session_id, "text": text})
    for n, command in enumerate(commands):
        command["n"] = n
    return commands


class Worker:
    """One run of the worker process, its acknowledgements read by a thread."""

    def __init__(self, backend: str, log: Path, runs: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.worker", backend, str(log), str(runs)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.acked: set[int] = set()
        self.ready = threading.Event()
        self.done = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            if "ack" in message:
                self.acked.add(message["ack"])
            elif message.get("ready"):
                self.ready.set()
            elif message.get("done"):
                self.done.set()

    def send(self, commands: list[dict[str, Any]]) -> None:
        """Write the commands, then "wait", from a thread (a kill may break the pipe)."""

        def write() -> None:
            assert self.process.stdin is not None
            with contextlib.suppress(OSError):
                for command in [*commands, {"op": "wait"}]:
                    self.process.stdin.write(json.dumps(command) + "\n")
                self.process.stdin.flush()

        threading.Thread(target=write, daemon=True).start()

    def kill(self) -> None:
        self.process.kill()
        self.finish()

    def finish(self) -> int:
        code = self.process.wait(timeout=ROUND_TIMEOUT)
        self.reader.join(timeout=ROUND_TIMEOUT)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()
        return code


def open_log(backend: str, path: Path) -> EventLog:
    return SqliteLog(path) if backend == "sqlite" else JsonlLog(path)


async def read_log(backend: str, path: Path) -> dict[str, list[Any]]:
    async with open_log(backend, path) as log:
        return {session_id: await log.read(session_id) for session_id in await log.sessions()}


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_kill_9_at_random_moments_loses_nothing_acknowledged(tmp_path: Path, backend: str) -> None:
    seed = int(os.environ.get("FAULT_SEED") or random.randrange(2**32))
    print(f"\n{backend}: seed {seed} (FAULT_SEED={seed} runs the same kills again)")
    rng = random.Random(seed)
    log = tmp_path / ("log.sqlite" if backend == "sqlite" else "log")
    runs = tmp_path / "runs.txt"
    commands = plan(SESSIONS)
    acked: set[int] = set()
    kills: list[str] = []
    started = time.monotonic()
    for round_ in range(KILLS + 1):
        worker = Worker(backend, log, runs)
        worker.send([command for command in commands if command["n"] not in acked])
        if round_ < KILLS:
            starting = rng.random() < 0.25
            if not starting:
                assert worker.ready.wait(ROUND_TIMEOUT), "the worker did not start"
            delay = rng.uniform(*(KILL_STARTING if starting else KILL_READY))
            finished = worker.done.wait(delay)
            worker.kill()
            when = "after starting" if starting else "after ready"
            if finished:
                what = "all done"
            elif not worker.ready.is_set():
                what = "recovering"
            else:
                what = f"{len(worker.acked)} acks in"
            kills.append(f"{delay:.2f} s {when} ({what})")
        else:
            assert worker.done.wait(ROUND_TIMEOUT), "the last round did not finish"
            assert worker.finish() == 0
        acked |= worker.acked
    print(f"{backend}: killed {len(kills)} times: {'; '.join(kills)}")
    assert acked == {command["n"] for command in commands}

    sessions = anyio.run(read_log, backend, log)
    # Every acknowledged create, message and result is in the log.
    for command in commands:
        events = sessions[command["id"]]
        if command["op"] == "message":
            texts = [
                e.event.text for e in events if isinstance(e.event, MessageQueued | MessageReceived)
            ]
            assert command["text"] in texts, command
        elif command["op"] == "results":
            returned = [
                (e.event.tool_call_id, e.event.text)
                for e in events
                if isinstance(e.event, ToolReturned)
            ]
            assert (command["call"], command["text"]) in returned, command
    assert sorted(sessions) == sorted({command["id"] for command in commands})
    # No gaps, every call answered, every session finished with the right answer.
    ran = Counter(runs.read_text().splitlines())
    runs_of: dict[str, Counter[str]] = {}
    for key, count in ran.items():
        owner, _, call_id = key.partition(" ")
        runs_of.setdefault(owner, Counter())[call_id] = count
    steps = 0
    for session_id, events in sessions.items():
        state = check_log(events)
        assert (state.status, state.pending, state.queued) == ("idle", (), ()), session_id
        # A handler runs only after its `local.tool_call`, each after the first of an
        # episode marked (`check_log`): every re-execution was preceded by a mark.
        logged = Counter(e.event.tool_call_id for e in events if isinstance(e.event, ToolCalled))
        for call_id, count in runs_of.get(session_id, {}).items():
            assert count <= logged[call_id], (session_id, call_id)
        last_user = [m for m in state.history if m["role"] == "user"][-1]["content"]
        assert state.history[-1]["content"] == answer_for(last_user), session_id
        for message in state.history:
            if message["role"] == "tool" and message["tool_call_id"].startswith("step-"):
                steps += 1
                assert ran[f"{session_id} {message['tool_call_id']}"] >= 1, session_id
    again = sum(count - 1 for count in ran.values())
    print(
        f"{backend}: {len(sessions)} sessions, {len(commands)} commands acknowledged, "
        f"{steps} step calls answered, {sum(ran.values())} executions, {again} re-executed; "
        f"{time.monotonic() - started:.1f} s"
    )
