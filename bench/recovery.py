"""Recovery: how long a new Host takes to rebuild the sessions of a SQLite log.

    python bench/recovery.py [--sessions 10000] [--round-trips 3] [--unfinished 0.1]

Writes a log as a worker would (sessions started at once, each `--round-trips` tool
round trips then an answer, on a scripted model with no latency), with a share of the
sessions (`--unfinished`) stopped in the middle of their work. Then times, over
`--repeat` new Hosts on the file, entering `async with Host(...)`: the host reads the
whole log, rebuilds every session and gives those with work a task (their model calls
wait on a gate, so none is made while timing). Prints the median and best time and the
events rebuilt per second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).parent))

from host import SPEC, Latency, scripted_model, step
from turnkeeper import Host, SqliteLog


async def write_log(path: Path, sessions: int, round_trips: int, unfinished: float) -> int:
    """The log of `sessions` sessions, the first `unfinished` share of them stopped
    before their answer; returns how many events it holds."""
    gate = anyio.Event()
    stopped = int(sessions * unfinished)
    latency = Latency(0.0)
    finishing = scripted_model(latency, round_trips)

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][1]["content"].endswith("stop"):
            done = sum(message["role"] == "tool" for message in request["messages"])
            if done == round_trips // 2:
                await gate.wait()
        response: dict[str, Any] = await finishing(request)
        return response

    async with SqliteLog(path) as log:
        async with (
            Host(chat=chat, log=log, tools={"step": step}, stop_grace=0) as host,
            anyio.create_task_group() as group,
        ):
            group.start_soon(latency.run)
            finishing_ids: list[str] = []

            async def start(index: int) -> None:
                stops = index < stopped
                session_id = await host.start(
                    SPEC, f"Do {round_trips} steps, {'stop' if stops else 'go'}"
                )
                if not stops:
                    finishing_ids.append(session_id)

            async with anyio.create_task_group() as starting:
                for index in range(sessions):
                    starting.start_soon(start, index)
            for session_id in finishing_ids:
                await host.result(session_id)
            group.cancel_scope.cancel()
        return len(await log.read_all())


async def time_recovery(path: Path) -> tuple[float, int]:
    """Seconds for a new Host to enter on the log, and how many sessions it resumed."""
    gate = anyio.Event()

    async def waiting(request: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        raise AssertionError("no model call is made while timing")

    async with SqliteLog(path) as log:
        started = time.perf_counter()
        async with Host(chat=waiting, log=log, tools={"step": step}, stop_grace=0) as host:
            taken = time.perf_counter() - started
            resumed = host.counters["sessions_recovered"]
    return taken, resumed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--round-trips", type=int, default=3)
    parser.add_argument("--unfinished", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "host.sqlite"
        events = await write_log(path, args.sessions, args.round_trips, args.unfinished)
        times = []
        resumed = 0
        for _ in range(args.repeat):
            taken, resumed = await time_recovery(path)
            times.append(taken)
    median = statistics.median(times)
    print(
        f"{args.sessions} sessions, {events:,} events, {resumed} resumed: recovery median "
        f"{median:.2f} s (best {min(times):.2f} s), {events / median:,.0f} events/s"
    )


if __name__ == "__main__":
    anyio.run(main, backend="trio")
