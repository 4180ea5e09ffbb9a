"""What the guards do for the embedded model: a fixed suite of small tool tasks, guards on and off.

    python bench/guards_embedded.py [--tasks N] [--only guards|off]

Runs each task as one `run` on the embedded model (SmolLM2-135M through EmbeddedChat,
temperature 0, max_turns 8) twice: with the default guards plus small-model mode (what
`turnkeeper run` uses for the embedded model), and with every guard off but max_turns,
which alone bounds a run (with it off too, a model that repeats a call never stops).
Prints a line per run, then a table per configuration: tasks whose final text or result
contains the tool's result, mean model calls per task, and runs that hit max_turns.
Figures, not assertions. The target with guards: no run hits max_turns, and at most 3
model calls per task on average.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from turnkeeper.core import AgentSpec, GuardConfig, MaxTurns, SmallModel, ToolSpec
from turnkeeper.providers import EmbeddedChat
from turnkeeper.sessions import RunResult, run
from turnkeeper.tools import EXAMPLE_TOOLS

MAX_TURNS = 8
SYSTEM_PROMPT = "You are a helpful assistant. Use the tools to answer."


def _integers(name: str, description: str) -> ToolSpec:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }
    return ToolSpec(name, description, schema)


async def add(a: int, b: int) -> str:
    """The sum of two integers."""
    return str(a + b)


async def multiply(a: int, b: int) -> str:
    """The product of two integers."""
    return str(a * b)


ToolFunction = Callable[..., Awaitable[Any]]
TOOLS: dict[str, tuple[ToolSpec, ToolFunction]] = {
    "add": (_integers("add", "Add two integers and return the sum."), add),
    "multiply": (_integers("multiply", "Multiply two integers and return the product."), multiply),
}
TOOLS.update(
    {spec.name: (spec, fn) for spec, fn in (t for t in EXAMPLE_TOOLS if isinstance(t, tuple))}
)


class Task(msgspec.Struct, frozen=True):
    """A prompt, the tools offered, and the text the right tool result holds."""

    kind: str
    prompt: str
    tools: tuple[str, ...]
    expected: str


def _tasks() -> tuple[Task, ...]:
    tasks: list[Task] = []
    for a, b in [(17, 25), (123, 456), (8, 9), (250, 75)]:
        tasks.append(Task("add", f"What is {a} plus {b}?", ("add",), str(a + b)))
    for a, b in [(6, 7), (12, 12), (25, 4), (9, 13)]:
        tasks.append(Task("multiply", f"What is {a} times {b}?", ("multiply",), str(a * b)))
    for value, source, target, expected in [
        (5, "km", "mi", "3.10686"),
        (3, "m", "ft", "9.84252"),
        (100, "F", "C", "37.7778"),
        (2, "kg", "lb", "4.40925"),
    ]:
        prompt = f"Convert {value} {source} to {target}."
        tasks.append(Task("convert", prompt, ("convert_units",), expected))
    for country, capital in [
        ("France", "Paris"),
        ("Japan", "Tokyo"),
        ("Peru", "Lima"),
        ("Kenya", "Nairobi"),
    ]:
        prompt = f"What is the capital of {country}?"
        tasks.append(Task("capital", prompt, ("capital_of",), capital))
    for text in [
        "the quick brown fox jumps over the lazy dog",
        "red green blue",
        "one small step for a man",
    ]:
        prompt = f"How many words are in this text: {text}"
        tasks.append(Task("count", prompt, ("count_text",), str(len(text.split()))))
    for a, b, c in [(3, 4, 5), (10, 6, 3), (7, 2, 9)]:
        prompt = f"Add {a} and {b} with the add tool, then multiply the sum by {c}."
        tasks.append(Task("add_multiply", prompt, ("add", "multiply"), str((a + b) * c)))
    return tuple(tasks)


TASKS = _tasks()

CONFIGS: dict[str, GuardConfig] = {
    "guards": GuardConfig(small_model=SmallModel()),
    "off": GuardConfig(
        max_turns=MaxTurns(),
        final_turn=None,
        duplicates=None,
        consecutive_errors=None,
        loop=None,
        terminal=None,
        budget=None,
        small_model=None,
    ),
}


class Outcome(msgspec.Struct, frozen=True):
    """One task's run under one configuration."""

    task: Task
    right: bool
    model_calls: int
    stop_reason: str
    seconds: float
    text: str


def holds(final: str, expected: str) -> bool:
    """Whether `final` contains `expected`; a number must not be part of a longer one."""
    if re.fullmatch(r"[\d.]+", expected):
        return re.search(rf"(?<![\d.]){re.escape(expected)}(?!\d)", final) is not None
    return expected.lower() in final.lower()


async def run_task(chat: EmbeddedChat, task: Task, guards: GuardConfig) -> Outcome:
    """Run one task to its end and judge its final text and result."""
    spec = AgentSpec(
        system_prompt=SYSTEM_PROMPT,
        tools=tuple(TOOLS[name][0] for name in task.tools),
        temperature=0.0,
    )
    started = time.perf_counter()
    result: RunResult = await run(
        spec,
        task.prompt,
        chat,
        tools={name: TOOLS[name][1] for name in task.tools},
        max_turns=MAX_TURNS,
        guards=guards,
    )
    seconds = time.perf_counter() - started
    final = (result.text or "") + (json.dumps(result.result) if result.result else "")
    return Outcome(
        task, holds(final, task.expected), result.turns, result.stop_reason, seconds, final
    )


def table(name: str, outcomes: list[Outcome]) -> str:
    """The summary of one configuration's outcomes, as a Markdown table."""
    count = len(outcomes)
    right = sum(outcome.right for outcome in outcomes)
    calls = sum(outcome.model_calls for outcome in outcomes)
    hit = sum(outcome.stop_reason == "max_turns_exceeded" for outcome in outcomes)
    seconds = sum(outcome.seconds for outcome in outcomes)
    reasons: dict[str, int] = {}
    for outcome in outcomes:
        reasons[outcome.stop_reason] = reasons.get(outcome.stop_reason, 0) + 1
    shown = ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items()))
    return "\n".join(
        [
            f"### {name}",
            "",
            "| tasks | result in answer | mean model calls | hit max_turns | s per call |",
            "|---|---|---|---|---|",
            f"| {count} | {right}/{count} | {calls / count:.2f} | {hit}/{count} "
            f"| {seconds / max(calls, 1):.2f} |",
            "",
            f"Stop reasons: {shown}.",
            "By kind (right/tasks): "
            + ", ".join(
                f"{kind} {sum(o.right for o in outcomes if o.task.kind == kind)}/"
                f"{sum(o.task.kind == kind for o in outcomes)}"
                for kind in dict.fromkeys(o.task.kind for o in outcomes)
            ),
        ]
    )


async def main(task_count: int, configs: list[str]) -> None:
    chat = EmbeddedChat(seed=1, max_tokens=64)
    tables = []
    for name in configs:
        outcomes = []
        for task in TASKS[:task_count]:
            outcome = await run_task(chat, task, CONFIGS[name])
            outcomes.append(outcome)
            mark = "ok " if outcome.right else "no "
            print(
                f"{name:6} {mark} {outcome.model_calls} calls {outcome.stop_reason:20} "
                f"{outcome.seconds:5.1f} s  {task.prompt[:50]!r} -> {outcome.text[:60]!r}",
                flush=True,
            )
        tables.append(table(name, outcomes))
    print()
    print("\n\n".join(tables))


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--tasks",
        type=int,
        default=len(TASKS),
        help=f"run the first N of the {len(TASKS)} tasks (default: all)",
    )
    parser.add_argument("--only", choices=sorted(CONFIGS), help="run one configuration")
    arguments = parser.parse_args()
    if not 1 <= arguments.tasks <= len(TASKS):
        parser.error(f"--tasks: expected 1 to {len(TASKS)}, got {arguments.tasks}")
    return arguments


if __name__ == "__main__":
    options = parse_arguments()
    anyio.run(main, options.tasks, [options.only] if options.only else list(CONFIGS))
