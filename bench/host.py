"""Many concurrent sessions in one Host on one SQLite log.

    python bench/host.py [--sessions 1000 10000] [--latency 0.05] [--round-trips 5]
                         [--max-model-calls 0 150] [--gc-threshold 50000]
                         [--switch-interval 0.001] [--profile]

All sessions start at once (as an orchestrator's requests would); each does
`--round-trips` tool round trips against a scripted model that takes `--latency`
seconds per reply, then answers. Prints, per session count and model-call limit
(`Host(max_model_calls=...)`, 0 for none), each run in a process of its own: durable
turns (model replies logged) per second, the event loop thread's CPU time per turn,
peak RSS per session, and p50/p99 of the time from a model reply to its events being
durable in SQLite (the commit of their transaction) and to their append returning to
the session (when the event loop has heard of the commit). A wait for a model-call
slot comes before the call, so it is not counted.

The default limit, 150 calls, is the target rate times the time a call holds its slot,
with some room: the model's 50 ms, then the wait until the event loop runs the reply's
task (2,000 turns/s x 50 ms would be 100 slots, which held throughput near 1,600
turns/s at 10,000 sessions, since each call kept its slot about 62 ms). The cycle
collector's first threshold is raised as a worker hosting thousands of sessions would
raise it: with Python's 700, each turn's short-lived objects outlive a few collections
at 10,000 sessions and full collections over every session's state take most of the
time (`--gc-threshold 0` keeps Python's). The interpreter's switch interval is lowered
to 1 ms, as `turnkeeper serve` lowers it: the SQLite writer thread needs the GIL back
after each commit, and the event loop's thread, busy with sessions, otherwise holds it
for up to 5 ms at a time (`--switch-interval 0` keeps Python's).

`--profile` runs each measurement under cProfile (the event loop's thread only) and prints
where a turn's CPU goes, by module: each module's own Python time, with the time of the C
functions it calls (msgspec's encoder, a list's append) counted to it, in µs per turn of
the profiled run, and the functions that take most. The profiler slows the loop about
twofold, so its shares matter, not its totals (the row above it is measured under it too).
"""

from __future__ import annotations

import argparse
import contextvars
import cProfile
import gc
import json
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import anyio

from turnkeeper import AgentSpec, Host, SqliteLog, ToolSpec
from turnkeeper.core import LogError
from turnkeeper.logs import Batch
from turnkeeper.providers import text_response, tool_response

SPEC = AgentSpec(system_prompt="Use the tool.", tools=(ToolSpec("step"),))

_replied_at: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "replied_at", default=None
)


def rss_bytes() -> int:
    """The process's resident set size now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


class TimedLog(SqliteLog):
    """A SqliteLog that times each append holding a model reply: from the reply to the
    commit of its transaction (durable), and to the append's return (the session goes on).

    The commit time is taken in the writer thread, around its `_commit`: a bench's peek
    at the log's insides, which the log offers no hook for.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reply_to_durable: list[float] = []
        self.reply_to_return: list[float] = []
        self._committed_at: dict[int, float] = {}

    async def _open(self) -> None:
        await super()._open()
        commit = self._writer._commit

        def timed(batches: list[Batch]) -> list[LogError | None]:
            outcomes = commit(batches)
            done = time.perf_counter()
            for batch in batches:
                self._committed_at[id(batch)] = done
            return outcomes

        self._writer._commit = timed  # type: ignore[method-assign]

    async def _append(self, batch: Batch) -> None:
        replied = _replied_at.get()
        try:
            await super()._append(batch)
        finally:
            committed = self._committed_at.pop(id(batch), None)
        if replied is None or committed is None:
            return
        # The scripted model reports nothing before its response: the response is the
        # batch's first event (looked at alone, so the bench's own cost stays small).
        if batch.events[0].type == "local.model_response":
            self.reply_to_durable.append(committed - replied)
            self.reply_to_return.append(time.perf_counter() - replied)
            _replied_at.set(None)


class Latency:
    """Model latency: each call waits `seconds`, woken by one timer task (`run`).

    One sleep per call would cost the event loop a cancel scope with a deadline, and a
    Cancelled raised and caught, per reply: far more than the socket wait a remote
    model's reply costs. Calls wait in order, all for the same time, so a queue serves.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._due: deque[tuple[float, anyio.Event]] = deque()
        self._queued = anyio.Event()

    async def wait(self) -> None:
        """Return `seconds` from now."""
        woken = anyio.Event()
        self._due.append((anyio.current_time() + self.seconds, woken))
        self._queued.set()
        await woken.wait()

    async def run(self) -> None:
        """Wake each call when its time comes (as the timer task, until cancelled)."""
        while True:
            if not self._due:
                self._queued = anyio.Event()
                await self._queued.wait()
            now = anyio.current_time()
            while self._due and self._due[0][0] <= now:
                self._due.popleft()[1].set()
            if self._due:
                await anyio.sleep(self._due[0][0] - now)


def scripted_model(latency: Latency, round_trips: int) -> Any:
    """Calls `step` until `round_trips` results are in, then answers, after `latency`."""

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        await latency.wait()
        # The system prompt, the user's, then a call and its result per round trip (counted
        # so, not by walking the messages: the stand-in's own cost stays small).
        done = len(request["messages"]) // 2 - 1
        response = (
            tool_response(("step", {"n": done}))
            if done < round_trips
            else text_response(f"finished {done} steps")
        )
        _replied_at.set(time.perf_counter())
        return response

    return chat


async def step(n: int) -> str:
    return f"step {n} done"


async def measure(
    sessions: int,
    latency: float,
    round_trips: int,
    max_model_calls: int | None,
    profiler: cProfile.Profile | None = None,
) -> dict[str, Any]:
    gc.collect()
    with tempfile.TemporaryDirectory() as folder:
        log = TimedLog(Path(folder) / "host.sqlite")
        async with log:
            baseline = rss_bytes()
            peak = baseline
            model_latency = Latency(latency)
            host = Host(
                chat=scripted_model(model_latency, round_trips),
                log=log,
                tools={"step": step},
                max_model_calls=max_model_calls,
            )
            ids: list[str] = []

            async def start() -> None:
                ids.append(await host.start(SPEC, f"Do {round_trips} steps."))

            async def sample_rss() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, rss_bytes())
                    await anyio.sleep(0.1)

            async with host:
                started = time.perf_counter()
                cpu_started = time.thread_time()
                if profiler is not None:
                    profiler.enable()
                async with anyio.create_task_group() as group:
                    group.start_soon(sample_rss)
                    group.start_soon(model_latency.run)
                    # As an orchestrator would: start every session at once, then wait for
                    # each (in turn: a task per waiting session would weigh on the host).
                    async with anyio.create_task_group() as starting:
                        for _ in range(sessions):
                            starting.start_soon(start)
                    for session_id in ids:
                        await host.result(session_id)
                    group.cancel_scope.cancel()
                if profiler is not None:
                    profiler.disable()
                elapsed = time.perf_counter() - started
                cpu = time.thread_time() - cpu_started
                peak = max(peak, rss_bytes())
                turns = host.counters.get("model_calls", 0)
                finished = sum(
                    [(await host.status(i)).text == f"finished {round_trips} steps" for i in ids]
                )
            durable = sorted(log.reply_to_durable)
            returned = sorted(log.reply_to_return)
    return {
        "sessions": sessions,
        "finished": finished,
        "turns": turns,
        "turns_per_s": turns / elapsed,
        "loop_cpu_us_per_turn": cpu / turns * 1e6,
        "rss_per_session_kb": (peak - baseline) / sessions / 1024,
        "peak_rss_mb": peak / 2**20,
        "p50_ms": statistics.median(durable) * 1000,
        "p99_ms": durable[int(len(durable) * 0.99)] * 1000,
        "return_p50_ms": statistics.median(returned) * 1000,
        "return_p99_ms": returned[int(len(returned) * 0.99)] * 1000,
    }


def module_of(file: str) -> str:
    """The dotted module name of a source file (`turnkeeper.sessions._host_actor`)."""
    for marker in ("/site-packages/", "/src/", "/lib/python3.11/", "/bench/"):
        if marker in file:
            file = file.rsplit(marker, 1)[1]
            if marker == "/bench/":
                file = "bench/" + file
            break
    name = file.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    return name or "?"


def package_of(module: str) -> str:
    """The part of the code a module belongs to: turnkeeper's subpackages apart."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] in ("turnkeeper", "bench") else parts[0]


def profiled(profiler: cProfile.Profile, turns: int) -> dict[str, Any]:
    """The profile in µs per turn: by module (its Python code's own time, with that of
    the C functions it calls) and the costliest functions."""
    stats: dict[tuple[str, int, str], Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    modules: dict[str, float] = {}
    functions: list[tuple[str, float, float]] = []
    for (file, line, name), (_, calls, own, _, callers) in stats.items():
        if file == "~":
            label = name
            counted = 0.0
            for (caller_file, _, _), timing in callers.items():
                if caller_file != "~":
                    module = module_of(caller_file)
                    modules[module] = modules.get(module, 0.0) + timing[2]
                    counted += timing[2]
            if own > counted:
                modules["(C, called from C)"] = (
                    modules.get("(C, called from C)", 0.0) + own - counted
                )
        else:
            label = f"{module_of(file)}:{line}({name})"
            modules[module_of(file)] = modules.get(module_of(file), 0.0) + own
        functions.append((label, own, calls))
    functions.sort(key=lambda function: -function[1])
    return {
        "modules": {module: seconds / turns * 1e6 for module, seconds in modules.items()},
        "functions": [
            (label, seconds / turns * 1e6, calls / turns)
            for label, seconds, calls in functions[:25]
        ],
    }


def print_profile(profile: dict[str, Any]) -> None:
    """The profile as tables: by package, by module, and the costliest functions."""
    modules: dict[str, float] = profile["modules"]
    total = sum(modules.values())
    packages: dict[str, float] = {}
    for module, us in modules.items():
        packages[package_of(module)] = packages.get(package_of(module), 0.0) + us
    print(f"  profiled: {total:.0f} us/turn of the event loop's CPU (slowed by the profiler)")
    for title, rows, count in (("package", packages, 12), ("module", modules, 25)):
        print(f"  {title:<44} {'us/turn':>8} {'share':>6}")
        for name, us in sorted(rows.items(), key=lambda row: -row[1])[:count]:
            print(f"  {name:<44} {us:>8.1f} {us / total:>6.1%}")
    print(f"  {'function (own time)':<70} {'us/turn':>8} {'calls/turn':>10}")
    for label, us, calls in profile["functions"]:
        print(f"  {label[-70:]:<70} {us:>8.1f} {calls:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--round-trips", type=int, default=5)
    parser.add_argument(
        "--max-model-calls",
        type=int,
        nargs="+",
        default=[0, 150],
        help="Host(max_model_calls=...) per run; 0 runs without a limit",
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=50_000,
        help="the cycle collector's first threshold (gc.set_threshold); 0 keeps Python's",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=0.001,
        help="the interpreter's switch interval in seconds (sys.setswitchinterval); 0 keeps "
        "Python's",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the event loop's thread (cProfile) and print where a turn's CPU goes",
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        if args.gc_threshold:
            gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
        if args.switch_interval:
            sys.setswitchinterval(args.switch_interval)
        profiler = cProfile.Profile() if args.profile else None
        row = anyio.run(
            measure,
            args.sessions[0],
            args.latency,
            args.round_trips,
            args.max_model_calls[0] or None,
            profiler,
            backend="trio",
        )
        if profiler is not None:
            row["profile"] = profiled(profiler, int(row["turns"]))
        print(json.dumps(row))
        return
    threshold = args.gc_threshold or gc.get_threshold()[0]
    print(f"cycle collector: first threshold {threshold} (Python's default is 700)")
    interval = args.switch_interval or sys.getswitchinterval()
    print(f"switch interval: {interval * 1000:g} ms (Python's default is 5 ms)")
    print(
        f"{'sessions':>8} {'max calls':>9} {'finished':>8} {'turns/s':>8} {'loop us/turn':>12} "
        f"{'KB/session':>10} {'peak RSS MB':>11} {'durable p50/p99 ms':>18} "
        f"{'returned p50/p99 ms':>19}"
    )
    for count in args.sessions:
        for limit in args.max_model_calls:
            # A process per run, so each starts from the same memory (and RSS is its own).
            command = [sys.executable, __file__, "--one", "--sessions", str(count)]
            command += ["--latency", str(args.latency), "--round-trips", str(args.round_trips)]
            command += ["--max-model-calls", str(limit), "--gc-threshold", str(args.gc_threshold)]
            command += ["--switch-interval", str(args.switch_interval)]
            command += ["--profile"] if args.profile else []
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            row = json.loads(done.stdout)
            print(
                f"{row['sessions']:>8.0f} {limit or 'none':>9} {row['finished']:>8.0f} "
                f"{row['turns_per_s']:>8.0f} {row['loop_cpu_us_per_turn']:>12.0f} "
                f"{row['rss_per_session_kb']:>10.1f} {row['peak_rss_mb']:>11.1f} "
                f"{row['p50_ms']:>8.1f} /{row['p99_ms']:>8.1f} "
                f"{row['return_p50_ms']:>8.1f} /{row['return_p99_ms']:>8.1f}",
                flush=True,
            )
            if "profile" in row:
                print_profile(row["profile"])


if __name__ == "__main__":
    main()
