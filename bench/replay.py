"""Replay speed: rebuilding sessions from SQLite and JSON Lines logs, in events per second.

    python bench/replay.py [--sessions 200] [--turns 25]

Records sessions of tool round trips with a scripted model into both logs, then times
reading every session back and folding it into its state with `replay` (and, to show
where the time goes, reading alone and folding alone).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from turnkeeper import AgentSpec, ToolSpec, replay, run
from turnkeeper.events import Envelope, EventLog, JsonlLog, SqliteLog
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    template = await record(args.turns)
    print(f"{args.sessions} sessions of {len(template)} events ({args.turns} tool round trips)")
    with tempfile.TemporaryDirectory() as folder:
        openers: dict[str, Callable[[], EventLog]] = {
            "SQLite": lambda: SqliteLog(Path(folder) / "log.sqlite"),
            "JSONL": lambda: JsonlLog(Path(folder) / "jsonl"),
        }
        total = 0
        for name, open_log in openers.items():
            async with open_log() as log:
                total = await fill(log, args.sessions, template)
            rates = [total / await time_replay(open_log) for _ in range(args.repeat)]
            read_rates = [total / await time_read(open_log) for _ in range(args.repeat)]
            print(
                f"  {name:6}: median {statistics.median(rates):>10,.0f} events/s "
                f"(best {max(rates):,.0f}, {total:,} events, open + read + replay); "
                f"open + read alone: median {statistics.median(read_rates):,.0f} events/s"
            )
        async with openers["SQLite"]() as log:
            sessions = [await log.read(session_id) for session_id in await log.sessions()]
        fold_rates = [total / time_fold(sessions) for _ in range(args.repeat)]
        print(f"  fold only (in memory): median {statistics.median(fold_rates):,.0f} events/s")


if __name__ == "__main__":
    anyio.run(main)
