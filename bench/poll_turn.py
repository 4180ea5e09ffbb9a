"""Overhead of one poll_turn with a zero-latency scripted model, and memory per idle session.

    python bench/poll_turn.py

Prints microseconds per poll at 10 and 200 messages of history: five runs of 1,000
polls each, every run's median, and the best run's median and p90. Each timed poll
answers the new tool call an untimed poll just got, as in a live session, and gets a new
one back; the garbage collector is paused while timing. As with `timeit.repeat`, the
best run is the figure: this machine's own speed drifts by up to 2x over seconds (a
pure-Python loop shows it too), and slower runs measure that drift, not turnkeeper.
Then the bytes a fresh SessionState holds (tracemalloc, averaged over many sessions
sharing one spec).
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from typing import Any

import anyio

from turnkeeper import (
    AgentSpec,
    Kickoff,
    Resume,
    SessionState,
    ToolResult,
    ToolSpec,
    open_session,
    poll_turn,
)

SPEC = AgentSpec(
    system_prompt="You are a helpful assistant. Use the tools.",
    tools=(
        ToolSpec(
            "search", "Search the web", {"type": "object", "properties": {"q": {"type": "string"}}}
        ),
        ToolSpec(
            "finish",
            "Give the final answer",
            {"type": "object", "properties": {"answer": {"type": "string"}}},
        ),
    ),
    terminal_tool="finish",
)


def tool_call_response(index: int) -> dict[str, Any]:
    return {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{index}",
                            "type": "function",
                            "function": {
                                "name": "search",
                                "arguments": f'{{"q": "query {index}"}}',
                            },
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10},
    }


async def session_with_history(messages: int) -> SessionState:
    """A session whose history has about `messages` messages (distinct calls and results)."""
    responses = iter(tool_call_response(i) for i in range(10_000))

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        return next(responses)

    state = open_session(SPEC, max_turns=10_000)
    _, state = await poll_turn(state, Kickoff("Find things."), chat)
    while len(state.history) < messages:
        use = state.pending[0]
        results = (ToolResult(use.id, f"result {use.id}"),)
        _, state = await poll_turn(state, Resume(state.pending, results), chat)
    return state


async def time_polls(
    messages: int, polls: int = 1000, warmup: int = 200, run: int = 0
) -> list[float]:
    """Microseconds for each of `polls` polls at about `messages` messages of history.

    Each timed poll follows an untimed one that got a new tool call from the model, as in
    a live session, and answers it: its argument check, decoding and guards all work on
    data no earlier poll has seen (ids and arguments are unique to the run, too). The
    first `warmup` polls are not counted.
    """
    base = await session_with_history(messages - 2)
    use = base.pending[0]
    resume = Resume(base.pending, (ToolResult(use.id, "the result"),))
    samples: list[float] = []
    # As timeit does, with the garbage collector paused while timing.
    gc.disable()
    try:
        for index in range(warmup + polls):
            unique = (messages * 100 + run) * 100_000 + index * 2
            first = tool_call_response(unique)
            second = tool_call_response(unique + 1)

            async def calls(request: dict[str, Any], first: Any = first) -> Any:
                return first

            async def chat(request: dict[str, Any], second: Any = second) -> Any:
                return second

            _, state = await poll_turn(base, resume, calls)
            pending = state.pending[0]
            answer = Resume(state.pending, (ToolResult(pending.id, f"result {index}"),))
            start = time.perf_counter_ns()
            await poll_turn(state, answer, chat)
            if index >= warmup:
                samples.append((time.perf_counter_ns() - start) / 1000)
    finally:
        gc.enable()
    return samples


def fresh_session_bytes(count: int = 10_000) -> float:
    """Average bytes allocated per fresh, idle SessionState."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    states = [open_session(SPEC) for _ in range(count)]
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    allocated = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert len(states) == count
    return allocated / count


async def main() -> None:
    print("poll_turn overhead (ScriptedChat-style zero-latency model, one tool result in):")
    for messages in (10, 200):
        runs = [sorted(await time_polls(messages, run=run)) for run in range(5)]
        medians = [statistics.median(samples) for samples in runs]
        best = runs[medians.index(min(medians))]
        p90 = best[int(len(best) * 0.9)]
        print(
            f"  history {messages:>3} messages: best run median {min(medians):5.1f} us, "
            f"p90 {p90:5.1f} us; run medians {', '.join(f'{m:.1f}' for m in medians)}"
        )
    print(f"fresh SessionState: {fresh_session_bytes():,.0f} bytes per session")


if __name__ == "__main__":
    anyio.run(main)
