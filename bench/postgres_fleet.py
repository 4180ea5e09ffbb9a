"""A fleet's figures on one PostgreSQL (bench/postgres.py's parts 3 and 4).

Part 3, takeover: two worker processes (a FleetHost each, lease `--lease`), one session
that works without end (each model call, 20 ms, calls a tool that answers at once). The
owner is killed with SIGKILL; the time is from the kill to the first event the new owner
logs (that event's `at`), over `--kills` kills, the killed worker started again after
each. Part 4, wake: a long-poll on a worker that does not own the session (a FleetHost's
`events(after=n, wait=...)`), from the owner's append of event n + 1 returning (it is
committed) to the long-poll returning it, over `--wakes` events.

    python bench/postgres.py --parts takeover,wake [--kills 20] [--lease 2] [--wakes 200]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

import anyio
import psycopg

from turnkeeper.core import AgentSpec, GuardConfig, ToolSpec
from turnkeeper.events import Envelope, MessageQueued
from turnkeeper.logs import PostgresLog
from turnkeeper.providers import tool_response
from turnkeeper.sessions import FleetHost

TICK = ToolSpec("tick", "Count.", {"type": "object", "properties": {"n": {"type": "integer"}}})
SPEC = AgentSpec(system_prompt="Count for ever.", tools=(TICK,))
# No guard stops a session that calls one tool for ever.
GUARDS = GuardConfig(max_turns=None, final_turn=None, duplicates=None, loop=None, self_feeding=None)
SESSION = "local_takeover_bench"


def quantiles(values: list[float]) -> tuple[float, float]:
    """p50 and p99 (nearest rank)."""
    ordered = sorted(values)
    p99 = ordered[max(0, min(len(ordered) - 1, round(0.99 * len(ordered)) - 1))]
    return statistics.median(ordered), p99


async def chat(request: dict[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.02)
    return tool_response(
        ("tick", {"n": len(request["messages"])}, f"call_{len(request['messages'])}")
    )


async def tick(n: int) -> str:
    return str(n)


async def run_worker(url: str, name: str, lease: float) -> None:
    """A worker process of part 3: starts the session when told to on stdin ("start")."""
    async with (
        PostgresLog(url, worker_id=name, lease=lease) as log,
        FleetHost(chat=chat, log=log, tools={"tick": tick}) as host,
    ):
        print("ready", flush=True)
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() == "start":
            await host.start(SPEC, "count", session_id=SESSION, max_turns=10**9, guards=GUARDS)
            print("started", flush=True)
        await anyio.sleep_forever()


class _Process:
    def __init__(self, url: str, name: str, lease: float) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, __file__, url, name, str(lease)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def tell(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def _owner_and_epoch(connection: psycopg.Connection[Any]) -> tuple[str | None, int]:
    row = connection.execute(
        "SELECT w.name, t.epoch FROM turnkeeper_sessions t "
        "LEFT JOIN turnkeeper_workers w ON w.id = t.owner WHERE t.session_id = %s",
        (SESSION,),
    ).fetchone()
    return (None, 0) if row is None else (row[0], row[1])


def _first_at(connection: psycopg.Connection[Any], epoch: int) -> float | None:
    row = connection.execute(
        "SELECT body FROM turnkeeper_events WHERE session_id = %s AND epoch > %s "
        "ORDER BY seq LIMIT 1",
        (SESSION, epoch),
    ).fetchone()
    return None if row is None else float(json.loads(row[0])["at"])


def takeovers(url: str, kills: int, lease: float) -> list[float]:
    """Part 3: seconds from each kill to the new owner's first event."""
    workers = {name: _Process(url, name, lease) for name in ("a", "b")}
    workers["a"].tell("start")
    times: list[float] = []
    try:
        with psycopg.connect(url, autocommit=True) as connection:
            for _ in range(kills):
                # Working under its owner for a moment first.
                time.sleep(0.5)
                owner, epoch = _owner_and_epoch(connection)
                while owner is None or _first_at(connection, epoch - 1) is None:
                    time.sleep(0.05)
                    owner, epoch = _owner_and_epoch(connection)
                killed = time.time()
                workers[owner].kill()
                while (first := _first_at(connection, epoch)) is None:
                    time.sleep(0.01)
                times.append(first - killed)
                workers[owner] = _Process(url, owner, lease)
    finally:
        for worker in workers.values():
            worker.kill()
    return times


async def wakes(url: str, count: int) -> list[float]:
    """Part 4: seconds from the owner's append returning to a non-owner's long-poll
    returning the event."""
    times: list[float] = []
    async with (
        PostgresLog(url, worker_id="owner") as owner,
        PostgresLog(url, worker_id="other") as other,
        FleetHost(chat=chat, log=other) as reader,
    ):
        session_id = "local_wake_bench"
        writer_host = FleetHost(chat=chat, log=owner)
        async with writer_host:
            await writer_host.start(SPEC, None, session_id=session_id)
        # The owner's log stays open: it still owns the session, and appends to it.
        seq = await owner.last_seq(session_id)
        await reader.events(session_id, after=0)
        for _ in range(count):
            woken: list[float] = []

            async def poll(after: int = seq, woken: list[float] = woken) -> None:
                found = await reader.events(session_id, after=after, wait=5.0)
                assert found
                woken.append(time.perf_counter())

            async with anyio.create_task_group() as group:
                group.start_soon(poll)
                await anyio.sleep(0.02)
                envelope = Envelope(session_id, seq + 1, time.time(), MessageQueued(text="hi"))
                await owner.append([envelope], expected_seq=seq)
                committed = time.perf_counter()
            seq += 1
            times.append(woken[0] - committed)
    return times


def print_figures(takeover: list[float] | None, wake: list[float] | None, lease: float) -> None:
    if takeover:
        p50, p99 = quantiles(takeover)
        # The issue's: within the lease and 2 s (12 s at the default lease), and under 3 s
        # with a 2 s lease.
        target = min(lease + 2, 1.5 * lease)
        print(f"\nTakeover after SIGKILL, lease {lease:g} s, {len(takeover)} kills")
        print(
            f"  p50 {p50:.2f} s, p99 {p99:.2f} s (target p99 under {target:g} s): "
            f"{'met' if p99 < target else 'NOT met'}"
        )
    if wake:
        p50, p99 = quantiles(wake)
        print(f"\nLong-poll wake on a non-owner, {len(wake)} events")
        print(
            f"  p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms (target p99 < 50 ms): "
            f"{'met' if p99 < 0.05 else 'NOT met'}"
        )


if __name__ == "__main__":
    anyio.run(run_worker, sys.argv[1], sys.argv[2], float(sys.argv[3]), backend="trio")
