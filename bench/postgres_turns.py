"""Durable turns/s of a fleet on one PostgreSQL (bench/postgres.py's part "turns").

`--sessions` sessions (10,000 by default) spread over `--workers` worker processes (4), a
FleetHost on a PostgresLog each, on the one database: as bench/host.py does on SQLite,
every worker starts its share at once (at the same moment as the others), each session
doing `--round-trips` tool round trips (5) against a scripted model that takes
`--latency` seconds per reply (50 ms), then answering. Turns/s is the model replies
logged by every worker over the time from the first start to the last session's end;
"durable" is from a model reply to the commit of its events (the writer's transaction
returning), over every worker's replies. Collector threshold 50,000 and switch interval
1 ms in each worker, as `turnkeeper serve` sets them.

    python bench/postgres.py --parts turns [--sessions 10000] [--workers 4] [--turn-repeats 2]
        [--latency 0.05] [--round-trips 5] [--max-model-calls 150]
"""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psycopg

from host import SPEC, Latency, _replied_at, scripted_model, step
from turnkeeper.logs import PostgresLog
from turnkeeper.logs._postgres_writer import Write
from turnkeeper.sessions import FleetHost

TARGET_P99_MS = 20.0


class TimedPostgresLog(PostgresLog):
    """A PostgresLog that times each write holding a model reply, from the reply to the
    commit of its round (a bench's peek at the writer's insides, as bench/host.py's
    TimedLog peeks at SQLite's)."""

    def __init__(self, url: str, *, worker_id: str) -> None:
        super().__init__(url, worker_id=worker_id)
        self.reply_to_durable: list[float] = []
        self._committed_at: dict[int, float] = {}

    async def _open(self) -> None:
        await super()._open()
        commit = self._writer._commit

        def timed(writes: list[Write], made: list[psycopg.Connection[Any]]) -> None:
            commit(writes, made)
            done = time.perf_counter()
            for write in writes:
                self._committed_at[id(write)] = done

        self._writer._commit = timed  # type: ignore[method-assign,assignment]

    async def _write(self, write: Write) -> None:
        replied = _replied_at.get()
        try:
            await super()._write(write)
        finally:
            committed = self._committed_at.pop(id(write), None)
        if replied is not None and committed is not None and "local.model_response" in write.types:
            self.reply_to_durable.append(committed - replied)
            _replied_at.set(None)


async def run_worker(
    url: str,
    name: str,
    sessions: int,
    start_at: float,
    latency: float,
    round_trips: int,
    max_model_calls: int,
) -> None:
    """One worker process: start `sessions` sessions at `start_at` (wall clock), wait for
    them all, print its figures as JSON."""
    log = TimedPostgresLog(url, worker_id=name)
    model_latency = Latency(latency)
    async with log:
        host = FleetHost(
            chat=scripted_model(model_latency, round_trips),
            log=log,
            tools={"step": step},
            max_model_calls=max_model_calls or None,
        )
        ids: list[str] = []

        async def start() -> None:
            ids.append(await host.start(SPEC, f"Do {round_trips} steps."))

        async with host:
            await anyio.sleep(max(0.0, start_at - time.time()))
            began = time.time()
            async with anyio.create_task_group() as group:
                group.start_soon(model_latency.run)
                async with anyio.create_task_group() as starting:
                    for _ in range(sessions):
                        starting.start_soon(start)
                for session_id in ids:
                    await host.result(session_id)
                ended = time.time()
                group.cancel_scope.cancel()
            turns = host.counters.get("model_calls", 0)
            finished = sum(
                [(await host.status(i)).text == f"finished {round_trips} steps" for i in ids]
            )
    print(
        json.dumps(
            {
                "began": began,
                "ended": ended,
                "turns": turns,
                "finished": finished,
                "durable": log.reply_to_durable,
            }
        )
    )


def turns(
    url: str, sessions: int, workers: int, latency: float, round_trips: int, max_model_calls: int
) -> dict[str, float]:
    """Run the workers at once; turns/s over them all and the durable p50/p99 (ms)."""
    start_at = time.time() + 4.0
    share = [sessions // workers + (index < sessions % workers) for index in range(workers)]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                url,
                f"turns-{index}",
                str(count),
                str(start_at),
                str(latency),
                str(round_trips),
                str(max_model_calls),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for index, count in enumerate(share)
    ]
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=900)
        if process.returncode != 0:
            raise SystemExit(f"a turns worker failed (exit {process.returncode})")
        results.append(json.loads(out))
    began = min(result["began"] for result in results)
    ended = max(result["ended"] for result in results)
    durable = sorted(value for result in results for value in result["durable"])
    return {
        "sessions": sessions,
        "finished": sum(result["finished"] for result in results),
        "turns_per_s": sum(result["turns"] for result in results) / (ended - began),
        "p50_ms": statistics.median(durable) * 1000,
        "p99_ms": durable[int(len(durable) * 0.99)] * 1000,
        "seconds": ended - began,
    }


def one_sqlite_host(
    sessions: int, latency: float, round_trips: int, max_model_calls: int
) -> dict[str, float]:
    """bench/host.py's run of the same sessions in one Host on SQLite, for the figures
    beside the fleet's on the same machine in the same minutes."""
    command = [sys.executable, str(Path(__file__).with_name("host.py")), "--one"]
    command += ["--sessions", str(sessions), "--max-model-calls", str(max_model_calls)]
    command += ["--latency", str(latency), "--round-trips", str(round_trips)]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=900)
    row: dict[str, float] = json.loads(done.stdout)
    return row


def print_row(name: str, row: dict[str, float]) -> None:
    print(
        f"{name:<28} {row['finished']:>8,.0f} {row['turns_per_s']:>8,.0f} "
        f"{row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f}",
        flush=True,
    )


def compare(
    url: str,
    sessions: int,
    workers: int,
    latency: float,
    round_trips: int,
    max_model_calls: int,
    repeats: int,
    empty: Callable[[], None],
) -> dict[str, list[dict[str, float]]]:
    """The fleet's runs and one SQLite Host's (bench/host.py), interleaved `repeats`
    times (the fleet first, then the other order), each row printed as it ends."""
    bound = f"max_model_calls={max_model_calls}" if max_model_calls else "no bound"
    print(
        f"{sessions:,} sessions, {round_trips} tool round trips, model {latency * 1000:g} ms "
        f"per reply, {bound} per Host"
    )
    print(f"{'':<28} {'finished':>8} {'turns/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    rows: dict[str, list[dict[str, float]]] = {"fleet": [], "sqlite": []}
    for repeat in range(repeats):
        for kind in ("fleet", "sqlite") if repeat % 2 == 0 else ("sqlite", "fleet"):
            if kind == "fleet":
                empty()
                row = turns(url, sessions, workers, latency, round_trips, max_model_calls)
                print_row(f"{workers} FleetHosts, PostgreSQL", row)
            else:
                row = one_sqlite_host(sessions, latency, round_trips, max_model_calls)
                print_row("one Host, SQLite", row)
            rows[kind].append(row)
    return rows


def print_turns(rows: dict[str, list[dict[str, float]]], workers: int) -> None:
    fleet = statistics.median(row["turns_per_s"] for row in rows["fleet"])
    sqlite = statistics.median(row["turns_per_s"] for row in rows["sqlite"])
    p99 = statistics.median(row["p99_ms"] for row in rows["fleet"])
    print(
        f"\n  {workers} workers on PostgreSQL: {fleet:,.0f} durable turns/s, durable p99 "
        f"{p99:.1f} ms (median of {len(rows['fleet'])}); one SQLite Host beside it: "
        f"{sqlite:,.0f} turns/s (ratio {fleet / sqlite:.2f}). No target in the issue; "
        f"bench/host.py's p99 target is under {TARGET_P99_MS:g} ms: "
        f"{'met' if p99 < TARGET_P99_MS else 'NOT met'}"
    )


if __name__ == "__main__":
    gc.set_threshold(50_000, *gc.get_threshold()[1:])
    sys.setswitchinterval(0.001)
    anyio.run(
        run_worker,
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        float(sys.argv[4]),
        float(sys.argv[5]),
        int(sys.argv[6]),
        int(sys.argv[7]),
        backend="trio",
    )
