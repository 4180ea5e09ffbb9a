"""Durable append throughput of the event logs, for 1 to 1,000 concurrent appenders.

Each appender is one session appending a turn's worth of events (a model response
and a tool call) at a time, each append durable before the next. Prints appends/s,
commits (transactions or fsynced writes)/s, appends per commit and append latency
(p50, p99). Figures, not assertions.

    python bench/log_append.py [--seconds 3] [--appenders 1,10,100,1000]
        [--logs sqlite,jsonl] [--backend trio]

trio is the default backend, as the service runs.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import msgspec

from turnkeeper.core import Usage
from turnkeeper.events import Envelope, ModelResponded, ToolCalled
from turnkeeper.logs import EventLog, JsonlLog, SqliteLog


def turn(session_id: str, seq: int) -> list[Envelope]:
    """A turn's events: a model response calling a tool, and the tool call about to run."""
    arguments = '{"query": "weather in Lisbon", "units": "metric"}'
    call = {
        "id": f"call_{seq}",
        "type": "function",
        "function": {"name": "search", "arguments": arguments},
    }
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    response = {
        "id": f"chatcmpl-{session_id}-{seq}",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 412, "completion_tokens": 31},
    }
    now = time.time()
    return [
        Envelope(
            session_id=session_id,
            seq=seq,
            at=now,
            event=ModelResponded(
                response=msgspec.Raw(msgspec.json.encode(response)),
                message=message,
                finish_reason="tool_calls",
                usage=Usage(prompt_tokens=412, completion_tokens=31),
            ),
        ),
        Envelope(
            session_id=session_id,
            seq=seq + 1,
            at=now,
            event=ToolCalled(tool_call_id=f"call_{seq}", name="search", input={"query": "x"}),
        ),
    ]


async def measure(log: EventLog, commits: Callable[[], int], appenders: int, seconds: float) -> str:
    """Run `appenders` sessions appending turns for `seconds`; one line of figures."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def appender(session_id: str) -> None:
        seq = 0
        while time.perf_counter() < deadline:
            events = turn(session_id, seq + 1)
            started = time.perf_counter()
            await log.append(events, expected_seq=seq)
            latencies.append(time.perf_counter() - started)
            seq += len(events)

    commits_before = commits()
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for index in range(appenders):
            group.start_soon(appender, f"bench-{appenders}-{index}")
    elapsed = time.perf_counter() - started
    count = len(latencies)
    committed = commits() - commits_before
    cuts = statistics.quantiles(latencies, n=100) if count > 1 else latencies * 99
    return (
        f"{appenders:>9} {count / elapsed:>10.0f} {2 * count / elapsed:>9.0f} "
        f"{committed / elapsed:>10.0f} {count / max(committed, 1):>10.1f} "
        f"{cuts[49] * 1000:>8.2f} {cuts[98] * 1000:>8.2f}"
    )


async def main(args: argparse.Namespace) -> None:
    appender_counts = [int(count) for count in args.appenders.split(",")]
    print(
        f"event log appends, {args.seconds:g} s per row, 2 events per append, "
        f"{os.cpu_count()} cores, SQLite {sqlite3.sqlite_version}, {args.backend}"
    )
    header = f"{'appenders':>9} {'appends/s':>10} {'events/s':>9} {'commits/s':>10} "
    header += f"{'per commit':>10} {'p50 ms':>8} {'p99 ms':>8}"
    kinds = args.logs.split(",")
    with tempfile.TemporaryDirectory() as directory:
        logs: dict[str, tuple[str, Callable[[], SqliteLog | JsonlLog]]] = {
            "sqlite": (
                "SqliteLog (WAL, synchronous=FULL, group commit)",
                partial(SqliteLog, Path(directory) / "log.db"),
            ),
            "jsonl": (
                "JsonlLog (one file per session, fsync per append)",
                partial(JsonlLog, Path(directory) / "jsonl"),
            ),
        }
        for kind, (title, open_log) in logs.items():
            if kind not in kinds:
                continue
            print(f"\n{title}")
            print(header)
            async with open_log() as log:
                for appenders in appender_counts:
                    line = await measure(log, lambda: log.commits, appenders, args.seconds)
                    print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--appenders", default="1,10,100,1000")
    parser.add_argument("--logs", default="sqlite,jsonl")
    parser.add_argument("--backend", default="trio", choices=["trio", "asyncio"])
    arguments = parser.parse_args()
    anyio.run(main, arguments, backend=arguments.backend)
