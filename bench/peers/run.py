"""turnkeeper side by side with OpenAI Agents SDK, pydantic-ai and LangGraph's prebuilt
ReAct agent, on the same task with the same zero-latency scripted model.

    pip install -e '.[bench]'
    python bench/peers/run.py

Workloads (see _task.py for the task):

- per-turn overhead: one session of `--round-trips` tool round trips at a time, timed
  end to end; wall time per session divided by its model calls, median over all
  sessions. The frameworks take turns, `--sessions` sessions each per repetition.
- memory per session: `--concurrent` sessions of `--concurrent-round-trips` round
  trips, all parked mid-run inside a tool call; resident memory (RSS) added per parked
  session, measured in a fresh process per framework and repetition (see _memory.py).
- looping model: a model that calls `fetch(i=0)` forever, each framework at its default
  settings; the model calls made before the run stops, and what stopped it. A run that
  reaches `--loop-cap` calls is reported as "> cap".

Every session is checked (each tool ran, in order, and the answer is right) so no
framework is timed doing less work. A framework that is not installed is reported as
missing. Prints the table, writes it as JSON (--json) and a chart (--png).
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _chart import chart
from _frameworks import FRAMEWORKS, PEERS, Missing, load
from _task import CURRENT, Adapter, CapReached, Session, WrongWork, check_session, prompt

HERE = Path(__file__).resolve().parent
TASK_MAX_TURNS = 50
"""The model-call limit every framework gets for the per-turn and memory workloads (the
task needs 11; openai-agents' default of 10 would stop it)."""
WARM_UP_SESSIONS = 5

TARGET_OVERHEAD = 1 / 20
TARGET_MEMORY = 1 / 3


@dataclass
class Outcome:
    """What was measured for one framework."""

    name: str
    version: str | None = None
    status: str = "ok"
    per_turn_us: list[float] = field(default_factory=list)
    model_us: list[float] = field(default_factory=list)
    rss_bytes: list[float] = field(default_factory=list)
    loop_calls: int | None = None
    loop_capped: bool = False
    loop_stopped_by: str | None = None

    def failed(self, why: str) -> None:
        if self.status == "ok":
            self.status = why


async def timed_sessions(
    adapter: Adapter, round_trips: int, count: int
) -> list[tuple[float, float]]:
    """For each of `count` sessions run one after another: microseconds per model call,
    and of those, the microseconds spent inside the scripted model."""
    samples = []
    text = prompt(round_trips)
    for _ in range(count):
        session = Session(round_trips)
        token = CURRENT.set(session)
        try:
            start = time.perf_counter_ns()
            ended = await adapter.session(text, TASK_MAX_TURNS)
            elapsed = time.perf_counter_ns() - start
        finally:
            CURRENT.reset(token)
        check_session(adapter.name, session, ended)
        calls = session.model_calls
        samples.append((elapsed / 1000 / calls, session.model_ns / 1000 / calls))
    return samples


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


async def run_in_process(
    adapters: dict[str, Adapter], outcomes: dict[str, Outcome], args: argparse.Namespace
) -> None:
    """The per-turn overhead and looping-model workloads, in this process."""
    for name, adapter in adapters.items():
        try:
            await timed_sessions(adapter, args.round_trips, WARM_UP_SESSIONS)
        except Exception as error:
            outcomes[name].failed(f"error: {error!r:.200}")
    live = [name for name in adapters if outcomes[name].status == "ok"]
    for repetition in range(args.repetitions):
        for name in rotated(live, repetition):
            if outcomes[name].status != "ok":
                continue
            gc.collect()
            try:
                samples = await timed_sessions(adapters[name], args.round_trips, args.sessions)
            except Exception as error:
                outcomes[name].failed(f"error: {error!r:.200}")
                continue
            outcomes[name].per_turn_us.extend(per_turn for per_turn, _ in samples)
            outcomes[name].model_us.extend(model for _, model in samples)
        print(f"  per-turn overhead: repetition {repetition + 1}/{args.repetitions} done")
    for name in live:
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
            outcomes[name].rss_bytes.append(rss)
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
        per_turn = outcome.per_turn_us
        frameworks.append(
            {
                "name": outcome.name,
                "version": outcome.version,
                "status": outcome.status,
                "per_turn_overhead_us": _median(per_turn),
                "per_turn_overhead_us_p10_p90": _spread(per_turn),
                "sessions_timed": len(per_turn),
                "scripted_model_us_per_call": _median(outcome.model_us),
                "memory_per_session_bytes": _median(outcome.rss_bytes),
                "memory_samples_bytes": [round(sample) for sample in outcome.rss_bytes],
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
            "memory_repetitions": args.memory_repetitions,
            "loop_cap": args.loop_cap,
            "task_max_turns": TASK_MAX_TURNS,
            "event_loop": "asyncio",
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
    """turnkeeper's ratio to the best peer on each measure, and whether it meets its target."""
    by_name = {framework["name"]: framework for framework in frameworks}
    ours = by_name.get("turnkeeper", {})
    peers = [by_name[name] for name in PEERS if by_name.get(name, {}).get("status") == "ok"]
    result: dict[str, Any] = {}
    for key, measure, target in (
        ("per_turn_overhead", "per_turn_overhead_us", TARGET_OVERHEAD),
        ("memory_per_session", "memory_per_session_bytes", TARGET_MEMORY),
    ):
        values = [(peer[measure], peer["name"]) for peer in peers if peer[measure] is not None]
        mine = ours.get(measure)
        if not values or mine is None:
            result[key] = None
            continue
        best, best_name = min(values)
        ratio = mine / best
        result[key] = {
            "best_peer": best_name,
            "ratio": round(ratio, 4),
            "target": f"<= {target:.3g}",
            "met": ratio <= target,
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
    """The summary as a text table."""
    header = (
        "framework",
        "version",
        "per-turn overhead (us, median)",
        "of which scripted model",
        "memory per session (KB RSS)",
        "looping model: calls to stop",
        "how it stops",
    )
    rows: list[tuple[str, ...]] = [header]
    for framework in summary["frameworks"]:
        if framework["status"] != "ok":
            name, version = framework["name"], framework["version"] or "-"
            rows.append((name, version, "-", "-", "-", "-", framework["status"]))
            continue
        calls = framework["looping_model_calls"]
        rows.append(
            (
                framework["name"],
                framework["version"],
                _number(framework["per_turn_overhead_us"]),
                _number(framework["scripted_model_us_per_call"]),
                _number(_kb(framework["memory_per_session_bytes"])),
                _calls(calls, framework["looping_model_capped"]),
                framework["looping_model_stopped_by"] or "-",
            )
        )
    ratios = summary["turnkeeper_vs_best_peer"]
    rows.append(
        (
            "turnkeeper / best peer",
            "",
            _ratio(ratios["per_turn_overhead"]),
            "",
            _ratio(ratios["memory_per_session"]),
            _ratio(ratios["looping_model_calls"]),
            "",
        )
    )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(cell.ljust(width) for cell, width in cells).rstrip())
        if index == 0 or index == len(rows) - 2:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _calls(calls: int | None, capped: bool) -> str:
    if calls is None:
        return "-"
    return f"> {calls:,}" if capped else f"{calls:,}"


def _kb(value: float | None) -> float | None:
    return None if value is None else value / 1024


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _ratio(comparison: dict[str, Any] | None) -> str:
    if comparison is None:
        return "-"
    verdict = "met" if comparison["met"] else "MISSED"
    return f"{comparison['ratio']:.3f} vs {comparison['best_peer']} ({verdict})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--round-trips", type=int, default=10, help="per-turn workload (10)")
    parser.add_argument(
        "--sessions", type=int, default=40, help="sessions per framework per repetition (40)"
    )
    parser.add_argument("--repetitions", type=int, default=5, help="per-turn repetitions (5)")
    parser.add_argument("--concurrent", type=int, default=1000, help="parked sessions (1000)")
    parser.add_argument("--concurrent-round-trips", type=int, default=5, help="memory workload (5)")
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
    for name in ("round_trips", "sessions", "repetitions", "concurrent", "loop_cap"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.concurrent_round_trips < 2:
        parser.error("--concurrent-round-trips must be at least 2 (sessions park mid-run)")
    if args.memory_repetitions < 1:
        parser.error("--memory-repetitions must be at least 1")
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
    args.json.write_text(json.dumps(summary, indent=2) + "\n")
    chart(summary, args.png, (TARGET_OVERHEAD, TARGET_MEMORY))
    print(f"\nwrote {args.json} and {args.png}")


if __name__ == "__main__":
    main()
