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


async def time_replay(log: EventLog) -> float:
    """Seconds to read the whole log in one pass and replay every session in it."""
    started = time.perf_counter()
    by_session: dict[str, list[Envelope]] = {}
    for _, envelope in await log.read_all():
        by_session.setdefault(envelope.session_id, []).append(envelope)
    for events in by_session.values():
        replay(events)
    return time.perf_counter() - started


async def time_read(log: EventLog) -> float:
    """Seconds to read the whole log in one pass, folding nothing."""
    started = time.perf_counter()
    await log.read_all()
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
        logs: dict[str, EventLog] = {
            "SQLite": SqliteLog(Path(folder) / "log.sqlite"),
            "JSONL": JsonlLog(Path(folder) / "jsonl"),
        }
        for name, log in logs.items():
            total = await fill(log, args.sessions, template)
            await log.close()
            reopened: EventLog = (
                SqliteLog(Path(folder) / "log.sqlite")
                if name == "SQLite"
                else JsonlLog(Path(folder) / "jsonl")
            )
            async with reopened:
                await reopened.sessions()
                rates = [total / await time_replay(reopened) for _ in range(args.repeat)]
                read_rates = [total / await time_read(reopened) for _ in range(args.repeat)]
            print(
                f"  {name:6}: median {statistics.median(rates):>10,.0f} events/s "
                f"(best {max(rates):,.0f}, {total:,} events, read + replay); "
                f"read alone: median {statistics.median(read_rates):,.0f} events/s"
            )
        started = time.perf_counter()
        for _ in range(args.repeat):
            replay(template)
        fold_rate = len(template) * args.repeat / (time.perf_counter() - started)
        print(f"  fold only (in memory): {fold_rate:,.0f} events/s")


if __name__ == "__main__":
    anyio.run(main)
