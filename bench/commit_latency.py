"""How long the SQLite log's commits take at a steady rate, with checkpoints in a thread
of their own (as the log runs) and inside the commits (SQLite's own, as it ran before).

    python bench/commit_latency.py [--sessions 10000] [--commits 2000] [--interval 0.004]
                                   [--appends 13] [--runs 2]

Logs a turn for each of `--sessions` sessions, then commits rounds of `--appends`
appends (a turn each, of sessions drawn at random, as a Host's rounds are) every
`--interval` seconds, calling the writer's commit directly in a thread, so that nothing
but SQLite and the disk is timed. Each run is a process of its own; the two ways take
turns. Prints, per run, the commits' p50 / p90 / p99 / p99.9 / longest, how many took
over 10 ms, and the checkpoints the checkpointer ran.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))

from log_append import turn
from turnkeeper.logs import Batch, SqliteLog, _sqlite_checkpointer, _sqlite_log, check_batch

_WAYS = {
    "thread": "checkpoints in a thread of their own",
    "inline": "checkpoints inside commits (SQLite's, every 1,000 pages)",
}


def checkpoint_inline() -> None:
    """Make logs opened from now on checkpoint as SQLite does by itself: in the commit
    that takes the WAL past 1,000 pages, with no checkpointer."""
    # The log module's own name for it, which `_connect` reads.
    setattr(_sqlite_log, "WRITER_CHECKPOINT_PAGES", 1000)  # noqa: B010
    _sqlite_checkpointer.Checkpointer.note_commit = lambda self: None  # type: ignore[method-assign]


async def measure(sessions: int, commits: int, interval: float, appends: int) -> str:
    with tempfile.TemporaryDirectory() as folder:
        async with SqliteLog(Path(folder) / "log.sqlite") as log:
            ids = [f"local_{index:016x}" for index in range(sessions)]
            for start in range(0, sessions, 500):
                async with anyio.create_task_group() as group:
                    for session_id in ids[start : start + 500]:
                        group.start_soon(partial(log.append, turn(session_id, 1), expected_seq=0))
            last = dict.fromkeys(ids, 2)
            writer = log._writer
            seconds: list[float] = []

            def drive() -> None:
                due = time.perf_counter()
                for _ in range(commits):
                    batches: list[Batch] = []
                    for session_id in random.sample(ids, appends):
                        seq = last[session_id]
                        batches.append(check_batch(turn(session_id, seq + 1), seq))
                        last[session_id] = seq + 2
                    due += interval
                    wait = due - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    started = time.perf_counter()
                    writer._commit(batches)
                    seconds.append(time.perf_counter() - started)

            await anyio.to_thread.run_sync(drive)
            checkpoints = writer._checkpointer.checkpoints
    seconds.sort()

    def cut(share: float) -> str:
        return f"{seconds[min(int(len(seconds) * share), len(seconds) - 1)] * 1000:.2f}"

    over = sum(taken > 0.010 for taken in seconds)
    return (
        f"p50 {cut(0.5)} / p90 {cut(0.9)} / p99 {cut(0.99)} / p99.9 {cut(0.999)} / "
        f"longest {seconds[-1] * 1000:.1f} ms; over 10 ms: {over} of {len(seconds)}; "
        f"checkpointer ran {checkpoints}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=0.004)
    parser.add_argument("--appends", type=int, default=13)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--way", choices=sorted(_WAYS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way is not None:
        if args.way == "inline":
            checkpoint_inline()
        line = anyio.run(measure, args.sessions, args.commits, args.interval, args.appends)
        print(line)
        return
    print(
        f"{args.commits} commits of {args.appends} appends (2 events each), one every "
        f"{args.interval * 1000:g} ms, over {args.sessions:,} sessions"
    )
    for run in range(1, args.runs + 1):
        for way, title in _WAYS.items():
            command = [sys.executable, __file__, "--way", way]
            for name in ("sessions", "commits", "interval", "appends"):
                command += [f"--{name}", str(getattr(args, name))]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            print(f"run {run}, {title}: {done.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
