"""Recovery: how long a new Host takes to rebuild the sessions of a SQLite log, and the
memory it takes doing so.

    python bench/recovery.py [--sessions 10000] [--round-trips 3] [--unfinished 0.1]
                             [--batches 1] [--max-resting 10000|none] [--repeat 5]

Writes a log as a worker would (sessions started at once, each `--round-trips` tool
round trips then an answer, on a scripted model with no latency), with a share of the
sessions (`--unfinished`) stopped in the middle of their work. With `--batches N` the
sessions are written in N batches, each finished before the next starts (as a worker
goes through its day); the unfinished ones are in the last. Then times, over `--repeat`
new Hosts on the file, each in a fresh process, entering `async with Host(...)`: the
host reads the whole log, rebuilds every session (letting go of those at rest beyond
`--max-resting` as it goes) and gives those with work a task (their model calls wait on
a gate, so none is made while timing). Prints the median and best time, the events
rebuilt per second, the sessions held after, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
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


async def time_recovery(path: Path, max_resting: int | None) -> tuple[float, int, int]:
    """Seconds for a new Host to enter on the log, how many sessions it resumed, and how
    many it holds after."""
    gate = anyio.Event()

    async def waiting(request: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        raise AssertionError("no model call is made while timing")

    async with SqliteLog(path) as log:
        started = time.perf_counter()
        async with Host(
            chat=waiting, log=log, tools={"step": step}, stop_grace=0, max_resting=max_resting
        ) as host:
            taken = time.perf_counter() - started
            resumed = host.counters["sessions_recovered"]
            held = len(host._sessions)
    return taken, resumed, held


def recover_in_a_fresh_process(path: Path, max_resting: str) -> tuple[float, int, int, float]:
    """`time_recovery` in a process of its own, so that its peak RSS is the recovery's:
    seconds, sessions resumed, sessions held, peak RSS in MB."""
    command = [sys.executable, __file__, "--recover", str(path), "--max-resting", max_resting]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    taken, resumed, held, peak = done.stdout.split()
    return float(taken), int(resumed), int(held), float(peak)


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM, not ru_maxrss: Linux carries that over from the
    parent across fork and exec, and the parent wrote the log)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def bound(text: str) -> int | None:
    return None if text == "none" else int(text)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--round-trips", type=int, default=3)
    parser.add_argument("--unfinished", type=float, default=0.1)
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--max-resting", default="10000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--recover", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.recover is not None:
        taken, resumed, held = await time_recovery(args.recover, bound(args.max_resting))
        print(taken, resumed, held, peak_rss_mb())
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "host.sqlite"
        events = 0
        per_batch = args.sessions // args.batches
        for batch in range(args.batches):
            last = batch == args.batches - 1
            count = args.sessions - per_batch * batch if last else per_batch
            share = args.unfinished * args.sessions / count if last else 0.0
            events = await write_log(path, count, args.round_trips, share)
        runs = [recover_in_a_fresh_process(path, args.max_resting) for _ in range(args.repeat)]
    times = [taken for taken, _, _, _ in runs]
    _, resumed, held, _ = runs[-1]
    median = statistics.median(times)
    print(
        f"{args.sessions} sessions in {args.batches} batch(es), {events:,} events, "
        f"max_resting {args.max_resting}: {resumed} resumed, {held} held; recovery median "
        f"{median:.2f} s (best {min(times):.2f} s), {events / median:,.0f} events/s; "
        f"peak RSS median {statistics.median(peak for _, _, _, peak in runs):.0f} MB"
    )


if __name__ == "__main__":
    anyio.run(main, backend="trio")
