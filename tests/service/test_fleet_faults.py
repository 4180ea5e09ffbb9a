"""Three `serve` workers on one PostgreSQL database, a driver spreading creates, messages,
tool results and long-polls over them at random, and faults: a worker killed with
SIGKILL, one paused with SIGSTOP past its lease and resumed, one paused briefly (under
its lease: no takeover), the workers' LISTEN connections killed, the database restarted
(on a server of the test's own; with TURNKEEPER_TEST_POSTGRES_URL, every connection to
it dropped instead). Then the database is
checked: each session's seqs run 1..n, its epochs never go down along them, every inbox
row was consumed, every logged tool call was answered, no call ran twice without a
`local.tool_may_have_run` before its second run, and every session finished as its
script says.

`TURNKEEPER_FAULT_ROUNDS` sets the rounds (default 5, one of each fault); each round
runs a fault, in turn.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import psycopg
import pytest

from tests.logs.test_postgres_log import eventually
from tests.postgres import new_schema, restartable_server
from tests.service.server_main import ASK_SPEC, LOOKUP_SPEC, answer_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "fleet-token-" + "x" * 20
LEASE = 2.0
WORKERS = 3
SESSIONS_PER_ROUND = 6
FAULTS = ("kill", "pause_past_lease", "pause_under_lease", "kill_listen", "restart_database")
ROUNDS = int(os.environ.get("TURNKEEPER_FAULT_ROUNDS", str(len(FAULTS))))
# How long a round may take before the test fails instead of hanging.
ROUND_SECONDS = 90.0
# How a listening connection's re-check of its waiters starts (logs/_postgres_waiters.py):
# between notifications, the last query a LISTEN connection ran.
_RECHECK = "SELECT session_id, last_seq FROM turnkeeper_sessions WHERE session_id = ANY"


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture
def database() -> Iterator[tuple[str, Callable[[], None]]]:
    """A schema on a server of the test's own, and a function that restarts the server."""
    with restartable_server() as (server, restart):
        yield new_schema(server), restart


class Worker:
    """One `serve` worker process (tests/service/fleet_main.py)."""

    def __init__(self, url: str, name: str, record: Path, stderr: Path) -> None:
        self.name = name
        self.pid = 0
        self.base = ""
        self.paused = False
        with stderr.open("ab") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.service.fleet_main",
                    "--log",
                    url,
                    "--worker-id",
                    name,
                    "--lease",
                    str(LEASE),
                    "--record",
                    str(record),
                ],
                cwd=ROOT,
                env={**os.environ, "TURNKEEPER_TOKEN": TOKEN},
                stdout=subprocess.PIPE,
                stderr=err,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {name} did not start:\n{stderr.read_text()}")
        ready = json.loads(line)
        self.pid = ready["pid"]
        self.base = ready["url"]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.alive:
            if self.paused:
                self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class Fleet:
    """The workers, and calls spread over them: each call goes to a random worker and, if
    that one does not answer (killed, paused), to another, until one does."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.record = tmp / "runs.txt"
        self.workers: list[Worker] = []
        self.started = 0
        self.client = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=httpx.Timeout(6.0),
            limits=httpx.Limits(max_connections=100),
        )
        self.calls = Counter[str]()

    def start(self) -> Worker:
        self.started += 1
        name = f"w{self.started}"
        worker = Worker(self.url, name, self.record, self.tmp / f"{name}.err")
        self.workers.append(worker)
        return worker

    async def call(
        self, method: str, path: str, *, key: str | None = None, **options: Any
    ) -> httpx.Response:
        """The first answer of a worker that answers (not a 5xx), sent again on failure
        with the same Idempotency-Key."""
        headers = {"Idempotency-Key": key} if key is not None else {}
        with anyio.fail_after(ROUND_SECONDS):
            while True:
                live = [w for w in self.workers if w.alive and not w.paused]
                worker = random.choice(live or self.workers)
                try:
                    response = await self.client.request(
                        method, worker.base + path, headers=headers, **options
                    )
                except httpx.HTTPError:
                    self.calls["failed over"] += 1
                    await anyio.sleep(0.1)
                    continue
                if response.status_code >= 500:
                    self.calls["failed over"] += 1
                    await anyio.sleep(0.1)
                    continue
                self.calls[method] += 1
                return response

    async def status(self, session_id: str, wait: float = 2.0) -> dict[str, Any]:
        response = await self.call("GET", f"/v1/sessions/{session_id}", params={"wait": wait})
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found


async def drive(fleet: Fleet, tag: str, ask: bool) -> tuple[str, str]:
    """One session's script: created, answered (for ask_human), sent a second prompt,
    answered again; returns its id and the text it should end with."""
    spec = ASK_SPEC if ask else LOOKUP_SPEC
    prompts = [f"{tag}-a", f"slow{tag}-b"]
    body = {"spec": _spec(spec), "prompt": prompts[0]}
    created = await fleet.call("POST", "/v1/sessions", key=f"create-{tag}", json=body)
    assert created.status_code == 201, created.text
    session_id: str = created.json()["session_id"]
    sent = 1
    while True:
        info = await fleet.status(session_id)
        if info["status"] == "requires_action":
            call = info["pending"][0]["id"]
            results = {"results": [{"tool_use_id": call, "text": "yes"}]}
            # Keyed by the call: seen waiting again (its results were accepted into a
            # paused worker's inbox, not done yet), it is sent again as the same request.
            key = f"results-{tag}-{call}"
            response = await fleet.call(
                "POST", f"/v1/sessions/{session_id}/tool_results", key=key, json=results
            )
            assert response.status_code == 202, response.text
            # And once more to another worker, as a client unsure of the first would.
            again = await fleet.call(
                "POST", f"/v1/sessions/{session_id}/tool_results", key=key, json=results
            )
            assert again.status_code == 202, again.text
        elif info["status"] == "idle":
            expected = answer_for(prompts[sent - 1], "yes" if ask else None)
            if info["text"] != expected:
                # Idle before the last message: posted to a worker's inbox, that worker
                # paused or dead, it is consumed once its session moves (202: accepted).
                await anyio.sleep(0.1)
                continue
            if sent == len(prompts):
                return session_id, expected
            response = await fleet.call(
                "POST",
                f"/v1/sessions/{session_id}/messages",
                key=f"message-{tag}-{sent}",
                json={"text": prompts[sent]},
            )
            assert response.status_code == 202, response.text
            sent += 1
            # Its events, long-polled from some worker: the message's come.
            events = await fleet.call(
                "GET",
                f"/v1/sessions/{session_id}/events",
                params={"after": info["seq"], "wait": 2},
            )
            assert events.status_code == 200
        else:
            assert info["status"] == "running", info


def _spec(spec: Any) -> dict[str, Any]:
    built: dict[str, Any] = msgspec.to_builtins(spec)
    return built


async def fault(fleet: Fleet, kind: str, url: str, restart: Callable[[], None]) -> None:
    """Do one fault to a random worker, partway through a round."""
    await anyio.sleep(random.uniform(0.3, 1.0))
    worker = random.choice([w for w in fleet.workers if w.alive])
    if kind == "kill":
        worker.signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(worker.stop)
        fleet.workers.remove(worker)
        await anyio.to_thread.run_sync(fleet.start)
    elif kind in ("pause_past_lease", "pause_under_lease"):
        owned_before = _owned(url, worker.name)
        worker.paused = True
        worker.signal(signal.SIGSTOP)
        await anyio.sleep(3 * LEASE if kind == "pause_past_lease" else LEASE / 5)
        if kind == "pause_under_lease":
            # Nothing was taken from it while it slept.
            now = _owned(url, worker.name)
            assert {key: now.get(key) for key in owned_before} == owned_before
        worker.signal(signal.SIGCONT)
        worker.paused = False
    elif kind == "restart_database":
        await anyio.to_thread.run_sync(restart)
    else:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE (query ILIKE 'LISTEN%%' OR query LIKE %s) AND pid <> pg_backend_pid()",
                (_RECHECK + "%",),
            )


def _owned(url: str, name: str) -> dict[str, int]:
    """The sessions the worker named owns, with their epochs."""
    with psycopg.connect(url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT t.session_id, t.epoch FROM turnkeeper_sessions t "
            "JOIN turnkeeper_workers w ON w.id = t.owner WHERE w.name = %s",
            (name,),
        ).fetchall()
    return dict(rows)


def check_database(url: str, record: Path, finished: dict[str, str]) -> dict[str, int]:
    """The checks of the module docstring; returns what was counted."""
    runs = Counter(line.split()[0] for line in record.read_text().splitlines() if line)
    with psycopg.connect(url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT session_id, seq, epoch, body FROM turnkeeper_events ORDER BY session_id, seq"
        ).fetchall()
        unconsumed = connection.execute(
            "SELECT count(*) FROM turnkeeper_inbox WHERE consumed IS NULL"
        ).fetchone()
        inbox = connection.execute("SELECT count(*) FROM turnkeeper_inbox").fetchone()
    assert unconsumed == (0,)
    by_session: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
    for session_id, seq, epoch, body in rows:
        by_session.setdefault(session_id, []).append((seq, epoch, json.loads(body)))
    assert set(by_session) == set(finished)
    marks = 0
    for session_id, events in by_session.items():
        assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1)), session_id
        epochs = [epoch for _, epoch, _ in events]
        assert epochs == sorted(epochs), session_id
        called: dict[str, str] = {}
        answered: set[str] = set()
        marked: set[str] = set()
        for _, _, envelope in events:
            event = envelope["event"]
            if event["type"] == "local.tool_call":
                called[event["tool_call_id"]] = event["input"]["key"]
            elif event["type"] == "local.tool_result":
                answered.add(event["tool_call_id"])
            elif event["type"] == "local.tool_may_have_run":
                marked.add(event["tool_call_id"])
        assert set(called) <= answered, session_id
        for call_id, key in called.items():
            if runs[key] > 1:
                assert call_id in marked, (session_id, call_id, key, runs[key])
        marks += len(marked)
    return {
        "sessions": len(by_session),
        "events": len(rows),
        "inbox rows": inbox[0] if inbox else 0,
        "tool runs": sum(runs.values()),
        "runs again": sum(n - 1 for n in runs.values()),
        "marked": marks,
    }


@pytest.mark.anyio
async def test_a_fleet_loses_nothing_through_kills_pauses_restarts_and_lost_notifications(
    database: tuple[str, Callable[[], None]], tmp_path: Path
) -> None:
    postgres_url, restart = database
    fleet = Fleet(postgres_url, tmp_path)
    finished: dict[str, str] = {}
    started = time.monotonic()
    try:
        for _ in range(WORKERS):
            await anyio.to_thread.run_sync(fleet.start)
        for round_number in range(ROUNDS):
            kind = FAULTS[round_number % len(FAULTS)]
            ends: dict[str, str] = {}

            async def one(tag: str, ask: bool, ends: dict[str, str] = ends) -> None:
                session_id, expected = await drive(fleet, tag, ask)
                ends[session_id] = expected

            with anyio.fail_after(ROUND_SECONDS):
                async with anyio.create_task_group() as group:
                    for index in range(SESSIONS_PER_ROUND):
                        group.start_soon(one, f"r{round_number}s{index}", index % 2 == 0)
                    group.start_soon(fault, fleet, kind, postgres_url, restart)
            for session_id, expected in ends.items():
                info = await fleet.status(session_id, wait=0)
                assert info["status"] == "idle", info
                assert info["text"] == expected, info
            finished.update(ends)
    finally:
        for worker in fleet.workers:
            await anyio.to_thread.run_sync(worker.stop)
        await fleet.client.aclose()
    counted = check_database(postgres_url, fleet.record, finished)
    counted["rounds"] = ROUNDS
    counted["failed over"] = fleet.calls["failed over"]
    counted["seconds"] = round(time.monotonic() - started)
    print("fleet fault test:", counted)
    assert counted["sessions"] == ROUNDS * SESSIONS_PER_ROUND


@pytest.mark.anyio
async def test_a_worker_resumed_after_its_session_moved_answers_as_the_database_does(
    database: tuple[str, Callable[[], None]], tmp_path: Path
) -> None:
    """A worker paused past its lease, whose session at rest another worker took over and
    moved on, answers for it, once resumed, what the database holds: not what it held
    when it was paused, neither before its lease is renewed nor after."""
    postgres_url, _ = database
    fleet = Fleet(postgres_url, tmp_path)
    try:
        paused = await anyio.to_thread.run_sync(fleet.start)
        other = await anyio.to_thread.run_sync(fleet.start)

        async def status(worker: Worker, session_id: str, wait: float = 0) -> dict[str, Any]:
            response = await fleet.client.get(
                f"{worker.base}/v1/sessions/{session_id}", params={"wait": wait}
            )
            assert response.status_code == 200, response.text
            found: dict[str, Any] = response.json()
            return found

        body = {"spec": _spec(ASK_SPEC), "prompt": "q"}
        created = await fleet.client.post(f"{paused.base}/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        asked = await status(paused, session_id, wait=30)
        assert asked["status"] == "requires_action", asked
        assert _owned(postgres_url, paused.name) == {session_id: 1}

        paused.paused = True
        paused.signal(signal.SIGSTOP)
        # The other worker's scan takes the session over once the lease has run out; it
        # is answered there, and comes to rest again.
        await eventually(lambda: _true(_owned(postgres_url, other.name) == {session_id: 2}))
        results = {"results": [{"tool_use_id": asked["pending"][0]["id"], "text": "yes"}]}
        answered = await fleet.client.post(
            f"{other.base}/v1/sessions/{session_id}/tool_results", json=results
        )
        assert answered.status_code == 202, answered.text
        done = await status(other, session_id, wait=30)
        assert done["status"] == "idle", done
        assert done["text"] == answer_for("q", "yes")

        paused.signal(signal.SIGCONT)
        paused.paused = False
        # At once, before its heartbeat has renewed its lease, and after.
        assert await status(paused, session_id) == done
        await eventually(lambda: _true(_live(postgres_url, paused.name)))
        await anyio.sleep(LEASE / 2)
        assert await status(paused, session_id) == done
        assert await status(paused, session_id, wait=1) == done
        events = await fleet.client.get(
            f"{paused.base}/v1/sessions/{session_id}/events",
            params={"after": done["seq"] - 1, "wait": 0},
        )
        assert [event["seq"] for event in events.json()["events"]] == [done["seq"]]
    finally:
        for worker in fleet.workers:
            await anyio.to_thread.run_sync(worker.stop)
        await fleet.client.aclose()
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT seq, epoch FROM turnkeeper_events WHERE session_id = %s ORDER BY seq",
            (session_id,),
        ).fetchall()
    # The paused worker wrote nothing once it had lost the session.
    assert [seq for seq, _ in rows] == list(range(1, done["seq"] + 1))
    assert [epoch for seq, epoch in rows if seq > asked["seq"]] == [2] * (
        done["seq"] - asked["seq"]
    )


async def _true(value: bool) -> bool:
    return value


def _live(url: str, name: str) -> bool:
    """Whether the worker named has a lease running on the database's clock."""
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT bool_or(expires > now()) FROM turnkeeper_workers WHERE name = %s", (name,)
        ).fetchone()
    return bool(row and row[0])
