"""Memory per parked session: resident memory (RSS) added per session, with many sessions
parked at once, each measurement in a fresh process so that none reuses another's memory.

    python bench/parked.py [--sessions 5000] [--round-trips 1 5 20]

Three ways a session parks: at rest in a `Host` (on a SQLite log) after its request's
round trips and answer, once for each `--round-trips`; inside a tool call in a `Host`,
measured `PACKED_AFTER` seconds after the last session entered it (a Host packs the
state of a session in its tool calls after one to two seconds); inside a tool call in
`run()`. Each session is a scripted model's tool round trips with
one tool, `step`; a parked tool call waits on an event until every session is parked.
RSS is read after a garbage collection, against the same reading before the sessions
started (and after a warm-up batch, so that lazy imports and caches are not counted).
Figures, not assertions; issue 23's target is printed beside them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

from turnkeeper import AgentSpec, Host, SqliteLog, ToolSpec, run
from turnkeeper.providers import text_response, tool_response

SPEC = AgentSpec(system_prompt="Use the tool.", tools=(ToolSpec("step"),))
WARM_UP = 20
TARGET_KB = 8.0
PACKED_AFTER = 2.5


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Sessions:
    """The scripted model and the tool of `round_trips` round trips, and the parking of
    the last one's tool call while `gate` is set."""

    def __init__(self, round_trips: int) -> None:
        self.round_trips = round_trips
        self.gate: anyio.Event | None = None
        self.parked = 0
        self.expected = 0
        self.all_in = anyio.Event()

    async def model(self, request: dict[str, Any]) -> dict[str, Any]:
        steps = sum(1 for message in request["messages"] if message["role"] == "tool")
        if steps < self.round_trips:
            return tool_response(("step", {"n": steps}, f"call_{steps}"), usage=(100, 5))
        return text_response(f"done after {steps} steps", usage=(100, 5))

    async def step(self, n: int) -> str:
        if n == self.round_trips - 1 and self.gate is not None:
            self.parked += 1
            if self.parked == self.expected:
                self.all_in.set()
            await self.gate.wait()
        return f"step {n} done"

    def park(self, count: int) -> None:
        """Park the next `count` sessions in their last tool call."""
        self.gate, self.parked, self.expected, self.all_in = anyio.Event(), 0, count, anyio.Event()


async def host_parked(sessions: int, round_trips: int, where: str) -> float:
    """RSS per session parked at rest (`where` "rest") or in a tool call ("tool")."""
    script = Sessions(round_trips)
    with tempfile.TemporaryDirectory() as folder:
        async with (
            SqliteLog(Path(folder) / "parked.sqlite") as log,
            Host(chat=script.model, log=log, tools={"step": script.step}) as host,
        ):
            for session_id in [await host.start(SPEC, "Go.") for _ in range(WARM_UP)]:
                await host.result(session_id)
            if where == "tool":
                script.park(sessions)
            gc.collect()
            before = rss_bytes()
            ids = [await host.start(SPEC, "Go.") for _ in range(sessions)]
            if where == "tool":
                await script.all_in.wait()
                await anyio.sleep(PACKED_AFTER)
            else:
                for session_id in ids:
                    await host.result(session_id)
            gc.collect()
            during = rss_bytes()
            if script.gate is not None:
                script.gate.set()
            for session_id in ids:
                info = await host.result(session_id)
                assert info.text == f"done after {round_trips} steps", info
    return (during - before) / sessions


async def run_parked(sessions: int, round_trips: int) -> float:
    """RSS per `run()` parked in a tool call."""
    script = Sessions(round_trips)
    answers: list[str | None] = []

    async def one() -> None:
        result = await run(SPEC, "Go.", chat=script.model, tools={"step": script.step})
        answers.append(result.text)

    for count in (WARM_UP, sessions):
        script.park(count)
        gc.collect()
        before = rss_bytes()
        async with anyio.create_task_group() as group:
            for _ in range(count):
                group.start_soon(one)
            await script.all_in.wait()
            gc.collect()
            during = rss_bytes()
            assert script.gate is not None
            script.gate.set()
    assert answers == [f"done after {round_trips} steps"] * (WARM_UP + sessions)
    return (during - before) / sessions


def measure(case: str, sessions: int, round_trips: int) -> float:
    """One case's RSS per session, measured in a process of its own."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", case, str(sessions), str(round_trips)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out.splitlines()[-1])["rss_bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--round-trips", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        case, sessions, round_trips = args.one[0], int(args.one[1]), int(args.one[2])
        if case == "run-tool":
            measured = anyio.run(run_parked, sessions, round_trips, backend="trio")
        else:
            where = case.removeprefix("host-")
            measured = anyio.run(host_parked, sessions, round_trips, where, backend="trio")
        print(json.dumps({"rss_bytes": measured}))
        return
    cases = [("host-rest", trips) for trips in args.round_trips]
    cases += [("host-tool", 3), ("run-tool", 3)]
    print(f"{args.sessions} sessions parked at once, trio; target under {TARGET_KB:g} KB each")
    print(f"{'parked':<10} {'round trips':>11} {'KB/session':>10}  target")
    for case, trips in cases:
        kb = measure(case, args.sessions, trips) / 1024
        met = "met" if kb < TARGET_KB else "not met"
        print(f"{case:<10} {trips:>11} {kb:>10.1f}  under {TARGET_KB:g} KB: {met}")


if __name__ == "__main__":
    main()
