"""turnkeeper side by side with OpenAI Agents SDK, pydantic-ai, LangGraph's prebuilt ReAct
agent and LangChain's `create_agent`, on the same task with the same zero-latency
scripted model.

    pip install -e '.[bench]'
    python bench/peers/run.py

Workloads (see _task.py for the task), each timed in wall time and in CPU time (the
process's, so a tool run in a worker thread counts), per model call:

- async tool: one session of `--round-trips` tool round trips at a time, the tool an
  async function; the median over all sessions. The frameworks take turns, `--sessions`
  sessions each per repetition.
- sync tool: the same with the tool a plain function, run the way each framework runs
  one by default (every peer hands it to a worker thread; turnkeeper's adapter does the
  same, since `run()` takes async tools).
- concurrent: `--concurrent` sessions of `--concurrent-round-trips` round trips started
  at once; the batch's wall and CPU time over its model calls, median over
  `--concurrent-repetitions` batches.
- memory per session: `--concurrent` sessions of `--concurrent-round-trips` round trips,
  all parked mid-run inside a tool call; resident memory (RSS) added per parked session,
  measured in a fresh process per framework and repetition (see _memory.py).
- looping model: a model that calls `fetch(i=0)` forever, each framework at its default
  settings; the model calls made before the run stops, and what stopped it. A run that
  reaches `--loop-cap` calls is reported as "> cap".

The timed workloads run in this one process, interleaved: each repetition runs every
framework's batch of each workload, starting with a different framework each time.
Every session is checked (each tool ran, in order, and the answer is right) so no
framework is timed doing less work. A framework that is not installed is reported as
missing. Prints the table with turnkeeper's ratio to the best peer on every measure,
writes it as JSON (--json) and a chart (--png).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _chart import Panel, chart
from _frameworks import FRAMEWORKS, PEERS, Missing, load
from _task import (
    CURRENT,
    Adapter,
    CapReached,
    Ended,
    Session,
    WrongWork,
    check_session,
    prompt,
)

HERE = Path(__file__).resolve().parent
TASK_MAX_TURNS = 50
"""The model-call limit every framework gets for the timed and memory workloads (the
task needs 11; openai-agents' default of 10 would stop it)."""
WARM_UP_SESSIONS = 5
WARM_UP_CONCURRENT = 50

TARGET_CPU = 1 / 40
TARGET_MEMORY = 1 / 8


@dataclass(frozen=True)
class Measure:
    """One row of the table: `key` in the results, what it is, how it is shown (`scale`
    times the value), and turnkeeper's target as a ratio to the best peer, if any."""

    key: str
    title: str
    scale: float = 1.0
    target: float | None = None


MEASURES = (
    Measure("async_wall_us", "async tool, one at a time: wall µs per model call"),
    Measure("async_cpu_us", "async tool, one at a time: CPU µs per model call", 1, TARGET_CPU),
    Measure("sync_wall_us", "sync tool, one at a time: wall µs per model call"),
    Measure("sync_cpu_us", "sync tool, one at a time: CPU µs per model call", 1, TARGET_CPU),
    Measure("concurrent_wall_us", "{concurrent} at once: wall µs per model call"),
    Measure("concurrent_cpu_us", "{concurrent} at once: CPU µs per model call", 1, TARGET_CPU),
    Measure("memory_bytes", "memory per parked session (KB RSS)", 1 / 1024, TARGET_MEMORY),
)
SCRIPTED_MODEL = "scripted model alone: wall µs per call (async tool)"


@dataclass(frozen=True)
class Sample:
    """Microseconds per model call: wall, CPU, and wall spent inside the scripted model."""

    wall_us: float
    cpu_us: float
    model_us: float


@dataclass
class Outcome:
    """What was measured for one framework: samples per measure key."""

    name: str
    version: str | None = None
    status: str = "ok"
    samples: dict[str, list[float]] = field(default_factory=dict)
    model_us: list[float] = field(default_factory=list)
    sync_calls: int = 0
    sync_calls_in_threads: int = 0
    loop_calls: int | None = None
    loop_capped: bool = False
    loop_stopped_by: str | None = None

    def failed(self, why: str) -> None:
        if self.status == "ok":
            self.status = why

    def add(self, prefix: str, samples: list[Sample]) -> None:
        self.samples.setdefault(f"{prefix}_wall_us", []).extend(s.wall_us for s in samples)
        self.samples.setdefault(f"{prefix}_cpu_us", []).extend(s.cpu_us for s in samples)


def _sample(wall_ns: int, cpu_ns: int, model_ns: int, calls: int) -> Sample:
    return Sample(wall_ns / 1000 / calls, cpu_ns / 1000 / calls, model_ns / 1000 / calls)


async def timed_sessions(
    adapter: Adapter, round_trips: int, count: int, *, sync_tool: bool
) -> list[tuple[Sample, Session]]:
    """`count` sessions run one after another, each timed and checked."""
    results = []
    text = prompt(round_trips)
    for _ in range(count):
        session = Session(round_trips)
        token = CURRENT.set(session)
        try:
            wall, cpu = time.perf_counter_ns(), time.process_time_ns()
            ended = await adapter.session(text, TASK_MAX_TURNS, sync_tool=sync_tool)
            cpu, wall = time.process_time_ns() - cpu, time.perf_counter_ns() - wall
        finally:
            CURRENT.reset(token)
        check_session(adapter.name, session, ended)
        results.append((_sample(wall, cpu, session.model_ns, session.model_calls), session))
    return results


async def _in_session(adapter: Adapter, session: Session) -> Ended:
    CURRENT.set(session)
    return await adapter.session(prompt(session.round_trips), TASK_MAX_TURNS)


async def timed_concurrent(adapter: Adapter, sessions: int, round_trips: int) -> Sample:
    """`sessions` sessions started at once, timed as one batch and each checked."""
    states = [Session(round_trips) for _ in range(sessions)]
    wall, cpu = time.perf_counter_ns(), time.process_time_ns()
    ends = await asyncio.gather(*(_in_session(adapter, state) for state in states))
    cpu, wall = time.process_time_ns() - cpu, time.perf_counter_ns() - wall
    for state, ended in zip(states, ends, strict=True):
        check_session(adapter.name, state, ended)
    calls = sum(state.model_calls for state in states)
    return _sample(wall, cpu, sum(state.model_ns for state in states), calls)


async def looping(adapter: Adapter, cap: int) -> tuple[int, bool, str]:
    """Model calls a forever-looping model makes under the framework's defaults, whether it
    hit `cap`, and what stopped it."""
    session = Session(round_trips=1, loop_cap=cap)
    token = CURRENT.set(session)
    try:
        ended = await adapter.session(prompt(1), None)
    except Exception as error:
        if _caused_by_cap(error):
            return cap, True, f"not stopped within {cap} calls"
        return session.model_calls, False, f"{type(error).__name__}: {_first_sentence(error)}"
    finally:
        CURRENT.reset(token)
    return session.model_calls, False, f"run returned, {ended.how}"


def _caused_by_cap(error: BaseException | None) -> bool:
    while error is not None:
        if isinstance(error, CapReached):
            return True
        error = error.__cause__ or error.__context__
    return False


def _first_sentence(error: BaseException) -> str:
    text = str(error).strip()
    return text.split(". ", 1)[0].splitlines()[0][:100] if text else ""


def measure_memory(name: str, sessions: int, round_trips: int) -> float:
    """RSS bytes per parked session, measured by _memory.py in a fresh process."""
    done = subprocess.run(
        [sys.executable, str(HERE / "_memory.py"), name, str(sessions), str(round_trips)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise WrongWork(f"{name}: memory worker failed: {last}")
    rss: float = json.loads(done.stdout.strip().splitlines()[-1])["rss_bytes"]
    return rss


def rotated(names: list[str], repetition: int) -> list[str]:
    """`names` starting at a different one each repetition, so none always runs first."""
    shift = repetition % len(names) if names else 0
    return names[shift:] + names[:shift]


async def _each(
    outcomes: dict[str, Outcome],
    names: list[str],
    repetition: int,
    measure: Callable[[str], Awaitable[None]],
) -> None:
    """`measure(name)` for each framework still ok, in rotated order, after a collection;
    a framework whose measurement raises is marked failed and left out from then on."""
    for name in rotated(names, repetition):
        if outcomes[name].status != "ok":
            continue
        gc.collect()
        try:
            await measure(name)
        except Exception as error:
            outcomes[name].failed(f"error: {error!r:.200}")


async def run_in_process(
    adapters: dict[str, Adapter], outcomes: dict[str, Outcome], args: argparse.Namespace
) -> None:
    """The timed workloads, interleaved, and the looping-model workload, in this process."""

    async def warm_up(name: str) -> None:
        adapter = adapters[name]
        for sync_tool in (False, True):
            await timed_sessions(adapter, args.round_trips, WARM_UP_SESSIONS, sync_tool=sync_tool)
        await timed_concurrent(adapter, WARM_UP_CONCURRENT, args.concurrent_round_trips)

    async def one_at_a_time(name: str) -> None:
        outcome, adapter = outcomes[name], adapters[name]
        done = await timed_sessions(adapter, args.round_trips, args.sessions, sync_tool=False)
        outcome.add("async", [sample for sample, _ in done])
        outcome.model_us.extend(sample.model_us for sample, _ in done)
        done = await timed_sessions(adapter, args.round_trips, args.sessions, sync_tool=True)
        outcome.add("sync", [sample for sample, _ in done])
        outcome.sync_calls += sum(len(session.calls) for _, session in done)
        outcome.sync_calls_in_threads += sum(session.calls_in_threads for _, session in done)

    async def concurrent(name: str) -> None:
        sample = await timed_concurrent(
            adapters[name], args.concurrent, args.concurrent_round_trips
        )
        outcomes[name].add("concurrent", [sample])

    names = list(adapters)
    await _each(outcomes, names, 0, warm_up)
    for repetition in range(max(args.repetitions, args.concurrent_repetitions)):
        if repetition < args.repetitions:
            await _each(outcomes, names, repetition, one_at_a_time)
        if repetition < args.concurrent_repetitions:
            await _each(outcomes, names, repetition, concurrent)
        print(f"  timed workloads: repetition {repetition + 1} done")
    for name in names:
        if outcomes[name].status != "ok":
            continue
        calls, capped, how = await looping(adapters[name], args.loop_cap)
        outcome = outcomes[name]
        outcome.loop_calls, outcome.loop_capped, outcome.loop_stopped_by = calls, capped, how
        print(f"  looping model: {name} stopped after {calls} calls")


def run_memory(outcomes: dict[str, Outcome], args: argparse.Namespace) -> None:
    """The memory workload, one fresh process per framework and repetition."""
    for repetition in range(args.memory_repetitions):
        live = [name for name, outcome in outcomes.items() if outcome.status == "ok"]
        for name in rotated(live, repetition):
            try:
                rss = measure_memory(name, args.concurrent, args.concurrent_round_trips)
            except WrongWork as error:
                outcomes[name].failed(f"error: {error}")
                continue
            outcomes[name].samples.setdefault("memory_bytes", []).append(rss)
        print(f"  memory: repetition {repetition + 1}/{args.memory_repetitions} done")


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
    }


def summarize(
    outcomes: dict[str, Outcome], args: argparse.Namespace, host: dict[str, Any]
) -> dict[str, Any]:
    """The results as JSON-ready data: per framework, and turnkeeper against the best peer."""
    frameworks = []
    for outcome in outcomes.values():
        frameworks.append(
            {
                "name": outcome.name,
                "version": outcome.version,
                "status": outcome.status,
                "measures": {m.key: _median(outcome.samples.get(m.key, [])) for m in MEASURES},
                "p10_p90": {m.key: _spread(outcome.samples.get(m.key, [])) for m in MEASURES},
                "samples": {key: len(values) for key, values in outcome.samples.items()},
                "scripted_model_us_per_call": _median(outcome.model_us),
                "sync_tool_calls_in_worker_threads": (
                    f"{outcome.sync_calls_in_threads} of {outcome.sync_calls}"
                ),
                "looping_model_calls": outcome.loop_calls,
                "looping_model_capped": outcome.loop_capped,
                "looping_model_stopped_by": outcome.loop_stopped_by,
            }
        )
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": host,
        "turnkeeper_commit": _commit(),
        "settings": {
            "round_trips": args.round_trips,
            "sessions_per_repetition": args.sessions,
            "repetitions": args.repetitions,
            "concurrent_sessions": args.concurrent,
            "concurrent_round_trips": args.concurrent_round_trips,
            "concurrent_repetitions": args.concurrent_repetitions,
            "memory_repetitions": args.memory_repetitions,
            "loop_cap": args.loop_cap,
            "task_max_turns": TASK_MAX_TURNS,
            "event_loop": "asyncio",
            "cpu_measure": "time.process_time (all the process's threads), per model call",
            "memory_measure": "RSS added per parked session (fresh process each), after gc",
        },
        "frameworks": frameworks,
        "turnkeeper_vs_best_peer": compare(frameworks),
    }


def _commit() -> str | None:
    """The checkout's git commit, with "+changes" when its tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "../../src"],
            cwd=HERE,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}+changes" if dirty else head


def _median(samples: list[float]) -> float | None:
    return round(statistics.median(samples), 1) if samples else None


def _spread(samples: list[float]) -> list[float] | None:
    if len(samples) < 2:
        return None
    deciles = statistics.quantiles(samples, n=10)
    return [round(deciles[0], 1), round(deciles[-1], 1)]


def compare(frameworks: list[dict[str, Any]]) -> dict[str, Any]:
    """turnkeeper's ratio to the best (lowest) peer on each measure, and whether it meets
    the measure's target, if it has one."""
    by_name = {framework["name"]: framework for framework in frameworks}
    ours = by_name.get("turnkeeper", {})
    peers = [by_name[name] for name in PEERS if by_name.get(name, {}).get("status") == "ok"]
    result: dict[str, Any] = {}
    for measure in MEASURES:
        values = [
            (peer["measures"][measure.key], peer["name"])
            for peer in peers
            if peer["measures"][measure.key] is not None
        ]
        mine = ours.get("measures", {}).get(measure.key) if ours.get("status") == "ok" else None
        if not values or mine is None:
            result[measure.key] = None
            continue
        best, best_name = min(values)
        ratio = mine / best
        result[measure.key] = {
            "best_peer": best_name,
            "ratio": round(ratio, 4),
            "target": None if measure.target is None else f"<= 1/{round(1 / measure.target)}",
            "met": None if measure.target is None else ratio <= measure.target,
        }
    loops = [peer for peer in peers if peer["looping_model_calls"] is not None]
    mine_calls = ours.get("looping_model_calls")
    if loops and mine_calls is not None and not ours.get("looping_model_capped"):
        best_peer = min(loops, key=lambda peer: peer["looping_model_calls"])
        result["looping_model_calls"] = {
            "best_peer": best_peer["name"],
            "ratio": round(mine_calls / best_peer["looping_model_calls"], 4),
            "target": "fewer calls than every peer",
            "met": all(mine_calls < peer["looping_model_calls"] for peer in loops),
        }
    else:
        result["looping_model_calls"] = None
    return result


def table(summary: dict[str, Any]) -> str:
    """The summary as a text table: a row per measure, a column per framework, then the
    best peer, turnkeeper's ratio to it and the target."""
    frameworks = summary["frameworks"]
    ratios = summary["turnkeeper_vs_best_peer"]
    concurrent = f"{summary['settings']['concurrent_sessions']:,}"
    header = ("measure", *(f["name"] for f in frameworks), "best peer", "turnkeeper/best", "target")
    rows: list[tuple[str, ...]] = [
        header,
        ("version", *(f["version"] or "-" for f in frameworks), "", "", ""),
    ]
    for measure in MEASURES:
        values = []
        for framework in frameworks:
            value = framework["measures"][measure.key]
            ok = framework["status"] == "ok" and value is not None
            values.append(_number(value * measure.scale) if ok else "-")
        rows.append(
            (measure.title.format(concurrent=concurrent), *values, *_ratio(ratios[measure.key]))
        )
    rows.append(
        (
            SCRIPTED_MODEL,
            *(_number(f["scripted_model_us_per_call"]) for f in frameworks),
            "",
            "",
            "",
        )
    )
    rows.append(
        (
            "sync tool calls run in a worker thread",
            *(f["sync_tool_calls_in_worker_threads"] for f in frameworks),
            "",
            "",
            "",
        )
    )
    rows.append(
        (
            "looping model: calls to stop",
            *(_calls(f["looping_model_calls"], f["looping_model_capped"]) for f in frameworks),
            *_ratio(ratios["looping_model_calls"]),
        )
    )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(cell.ljust(width) for cell, width in cells).rstrip())
        if index == 1:
            lines.append("  ".join("-" * width for width in widths))
    notes = [f"{f['name']}: {f['status']}" for f in frameworks if f["status"] != "ok"]
    notes += [
        f"{f['name']} looping model stopped by: {f['looping_model_stopped_by']}"
        for f in frameworks
        if f["looping_model_stopped_by"]
    ]
    return "\n".join([*lines, "", *notes])


def _calls(calls: int | None, capped: bool) -> str:
    if calls is None:
        return "-"
    return f"> {calls:,}" if capped else f"{calls:,}"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _ratio(comparison: dict[str, Any] | None) -> tuple[str, str, str]:
    """The best peer, the ratio and the target with its verdict, as table cells."""
    if comparison is None:
        return "-", "-", ""
    target = comparison["target"]
    met = "met" if comparison["met"] else "MISSED"
    verdict = "" if target is None else f"{target} ({met})"
    return comparison["best_peer"], f"{comparison['ratio']:.4f}", verdict


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--round-trips", type=int, default=10, help="one-at-a-time workloads (10)")
    parser.add_argument(
        "--sessions", type=int, default=40, help="sessions per framework per repetition (40)"
    )
    parser.add_argument("--repetitions", type=int, default=5, help="one-at-a-time repetitions (5)")
    parser.add_argument(
        "--concurrent", type=int, default=1000, help="sessions at once, timed and parked (1000)"
    )
    parser.add_argument(
        "--concurrent-round-trips", type=int, default=5, help="concurrent and memory workloads (5)"
    )
    parser.add_argument(
        "--concurrent-repetitions", type=int, default=3, help="concurrent batches (3)"
    )
    parser.add_argument(
        "--memory-repetitions", type=int, default=1, help="memory processes per framework (1)"
    )
    parser.add_argument(
        "--loop-cap", type=int, default=10_000, help="looping model calls before giving up"
    )
    parser.add_argument(
        "--only", nargs="+", choices=list(FRAMEWORKS), help="measure only these frameworks"
    )
    parser.add_argument("--json", type=Path, default=HERE / "results.json", help="JSON output")
    parser.add_argument("--png", type=Path, default=HERE / "results.png", help="chart output")
    args = parser.parse_args(argv)
    for name in (
        "round_trips",
        "sessions",
        "repetitions",
        "concurrent",
        "concurrent_repetitions",
        "memory_repetitions",
        "loop_cap",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.concurrent_round_trips < 2:
        parser.error("--concurrent-round-trips must be at least 2 (sessions park mid-run)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    outcomes: dict[str, Outcome] = {}
    adapters: dict[str, Adapter] = {}
    for name in args.only or FRAMEWORKS:
        outcome = outcomes[name] = Outcome(name)
        try:
            adapter = load(name)
        except Missing as error:
            outcome.status = f"missing: {error}"
            continue
        outcome.version = adapter.version
        adapters[name] = adapter
    print(f"frameworks: {', '.join(f'{n} {a.version}' for n, a in adapters.items())}")
    host = machine()
    started = time.monotonic()
    asyncio.run(run_in_process(adapters, outcomes, args))
    run_memory(outcomes, args)
    print(f"  measured in {time.monotonic() - started:.0f} s")
    summary = summarize(outcomes, args, host)
    print()
    print(table(summary))
    args.json.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    panels = [
        Panel(m.key, m.title.format(concurrent=f"{args.concurrent:,}"), m.scale, m.target)
        for m in MEASURES
        if m.target is not None
    ]
    chart(summary, args.png, panels)
    print(f"\nwrote {args.json} and {args.png}")


if __name__ == "__main__":
    main()
