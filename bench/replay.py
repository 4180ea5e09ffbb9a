"""Replay speed: rebuilding sessions from SQLite and JSON Lines logs, in events per second.

    python bench/replay.py [--sessions 200] [--turns 25]

Records sessions of tool round trips with a scripted model into both logs, then times
reading every session back and folding it into its state with `replay` (and, to show
where the time goes, reading alone, folding alone, and the share of the time the cycle
collector ran). Each figure is the median of `--repeat` runs, with the best run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from turnkeeper import AgentSpec, ToolSpec, replay, run
from turnkeeper.events import Envelope
from turnkeeper.logs import EventLog, JsonlLog, SqliteLog
from turnkeeper.providers import text_response, tool_response

SPEC = AgentSpec(system_prompt="Look things up.", tools=(ToolSpec("lookup"),))


async def record(turns: int) -> tuple[Envelope, ...]:
    """One session's log: `turns` tool round trips and an answer."""
    calls = iter(range(turns))

    async def chat(request: dict[str, object]) -> dict[str, object]:
        step = next(calls, None)
        if step is None:
            return text_response("done")
        return tool_response(("lookup", {"key": f"item {step}"}))

    async def lookup(key: str) -> str:
        return f"the value of {key} is {len(key) * 7}"

    result = await run(
        SPEC, "Look up everything.", chat, tools={"lookup": lookup}, max_turns=turns + 5
    )
    return result.events


async def fill(log: EventLog, sessions: int, template: tuple[Envelope, ...]) -> int:
    """Write `sessions` copies of the template session under fresh ids."""
    count = 0
    for index in range(sessions):
        session_id = f"local_{index:016x}"
        events = [
            Envelope(session_id, envelope.seq, envelope.at, envelope.event) for envelope in template
        ]
        await log.append(events, expected_seq=0)
        count += len(events)
    return count


async def time_replay(open_log: Callable[[], EventLog]) -> float:
    """Seconds to open the log, read it whole in one pass and replay every session in it.

    Opening counts: the JSONL log decodes its files then, the SQLite log when read.
    """
    started = time.perf_counter()
    async with open_log() as log:
        by_session: dict[str, list[Envelope]] = {}
        for _, envelope in await log.read_all():
            by_session.setdefault(envelope.session_id, []).append(envelope)
        for events in by_session.values():
            replay(events)
    return time.perf_counter() - started


async def time_read(open_log: Callable[[], EventLog]) -> float:
    """Seconds to open the log and read it whole in one pass, folding nothing."""
    started = time.perf_counter()
    async with open_log() as log:
        await log.read_all()
    return time.perf_counter() - started


def time_fold(sessions: list[list[Envelope]]) -> float:
    """Seconds to replay sessions already in memory."""
    started = time.perf_counter()
    for events in sessions:
        replay(events)
    return time.perf_counter() - started


@contextmanager
def collector_time() -> Iterator[list[float]]:
    """Seconds the cycle collector runs within the block, in the one-item list yielded."""
    spent = [0.0]
    started = [0.0]

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]

    gc.callbacks.append(note)
    try:
        yield spent
    finally:
        gc.callbacks.remove(note)


async def rates(total: int, repeat: int, timed: Callable[[], Awaitable[float]]) -> str:
    """The median and best of `repeat` runs of `timed` in events per second, and the share
    of the time the cycle collector ran (over all runs)."""
    seconds = []
    with collector_time() as collecting:
        for _ in range(repeat):
            seconds.append(await timed())
    speeds = [total / taken for taken in seconds]
    return (
        f"median {statistics.median(speeds):,.0f} events/s (best {max(speeds):,.0f}; "
        f"collector {collecting[0] / sum(seconds):.0%})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    template = await record(args.turns)
    print(
        f"{args.sessions} sessions of {len(template)} events ({args.turns} tool round trips), "
        f"{args.sessions * len(template):,} events; each figure over {args.repeat} runs"
    )
    with tempfile.TemporaryDirectory() as folder:
        openers: dict[str, Callable[[], EventLog]] = {
            "SQLite": lambda: SqliteLog(Path(folder) / "log.sqlite"),
            "JSONL": lambda: JsonlLog(Path(folder) / "jsonl"),
        }
        total = 0
        for name, open_log in openers.items():
            async with open_log() as log:
                total = await fill(log, args.sessions, template)
            replayed = await rates(total, args.repeat, partial(time_replay, open_log))
            read = await rates(total, args.repeat, partial(time_read, open_log))
            print(f"  {name:6}  open + read + replay: {replayed}")
            print(f"  {name:6}  open + read alone:    {read}")
        async with openers["SQLite"]() as log:
            sessions = [await log.read(session_id) for session_id in await log.sessions()]

        async def fold_only() -> float:
            return time_fold(sessions)

        print(f"  fold only (in memory):        {await rates(total, args.repeat, fold_only)}")


if __name__ == "__main__":
    anyio.run(main)
