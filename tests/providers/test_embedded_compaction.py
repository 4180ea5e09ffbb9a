"""Compaction on the embedded model (SmolLM2-135M), really generating: it counts tokens with
its own tokenizer, declares its window, and writes the summary that takes the place of a
reattached transcript's older turns, by default."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest

from turnkeeper import AgentSpec, Compaction, ToolSpec, recheck, replay, run
from turnkeeper.core import approx_tokens, context_window, degenerate, estimate_tokens, text_of
from turnkeeper.events import Compacted, CompactionFailed
from turnkeeper.providers import EmbeddedChat, with_retry
from turnkeeper.sessions._compaction import SUMMARY_LEAD

ADD = ToolSpec(
    "add",
    "Add two integers and return the sum.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
SPEC = AgentSpec(
    system_prompt="You are a helpful assistant. Use the tools to answer.",
    tools=(ADD,),
    temperature=0.0,
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


def call(call_id: str, a: int, b: int) -> dict[str, Any]:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


def transcript(rounds: int) -> list[dict[str, Any]]:
    """A reattached conversation: `rounds` sums with the tool, each with a fact of a trip
    being planned."""
    history: list[dict[str, Any]] = [{"role": "system", "content": SPEC.system_prompt}]
    for n in range(rounds):
        a, b = 17 + 3 * n, 25 + 7 * n
        history += [
            {"role": "user", "content": f"What is {a} plus {b}?"},
            {"role": "assistant", "content": None, "tool_calls": [call(f"c{n}", a, b)]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": str(a + b)},
            {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
            {"role": "user", "content": FACTS[n % len(FACTS)]},
            {"role": "assistant", "content": "Noted."},
        ]
    return history


async def add(a: int, b: int) -> str:
    return str(a + b)


@pytest.fixture(scope="module")
def chat() -> EmbeddedChat:
    return EmbeddedChat(seed=3, max_tokens=48)


@pytest.mark.anyio
async def test_the_model_counts_tokens_with_its_tokenizer(chat: EmbeddedChat) -> None:
    messages = transcript(1)
    counted = await estimate_tokens(chat, messages)
    assert counted == await chat.estimate_tokens(messages)
    # Its count of the same prompt, as generating it counts it: the JSON it counts holds a
    # little more than the chat template does.
    asked = [m for m in messages if m["role"] != "tool" and m.get("content")]
    response = await chat.complete({"messages": asked, "max_tokens": 1})
    prompt_tokens = response["usage"]["prompt_tokens"]
    estimate = await chat.estimate_tokens(asked)
    assert prompt_tokens <= estimate <= 1.5 * prompt_tokens
    # Not the default estimate (bytes / 4), which a backend with no tokenizer gets.
    assert counted != approx_tokens(messages, [])
    assert context_window(chat) == chat.n_ctx == 4096
    assert context_window(with_retry(chat)) == 4096


@pytest.mark.anyio
async def test_the_model_writes_the_summary_of_older_turns(chat: EmbeddedChat) -> None:
    spec = msgspec.structs.replace(
        SPEC, compaction=Compaction(budget_tokens=150, keep_recent_turns=1, summary_tokens=64)
    )
    history = transcript(2)
    result = await run(
        spec, "And what is 42 plus 8?", chat, tools={"add": add}, history=history, max_turns=4
    )
    # The first poll summarises the transcript (later ones may again: the budget is small).
    compacted = next(e.event for e in result.events if "compact" in e.type)
    assert isinstance(compacted, Compacted)
    assert (compacted.start, compacted.end, compacted.kept) == (1, len(history), ())
    assert compacted.estimated > 150
    summary = text_of(compacted.message) or ""
    assert summary.startswith(SUMMARY_LEAD)
    written = summary[len(SUMMARY_LEAD) :]
    assert written.strip()
    assert not degenerate(written)
    # Written from the transcript: it names what happened there.
    words = set(re.findall(r"[A-Za-z]{4,}|\d+", written))
    assert words & {"Lyon", "Paris", "Tom", "Ada", "trip", "brother", "42", "plus"}
    assert compacted.usage.completion_tokens <= 64
    first_call = next(e for e in result.events if e.type == "local.model_response")
    assert first_call.seq > next(e.seq for e in result.events if e.event is compacted)
    assert replay(result.events[: first_call.seq - 1]).history == (
        history[0],
        compacted.message,
        {"role": "user", "content": "And what is 42 plus 8?"},
    )
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


@pytest.mark.anyio
async def test_the_embedded_model_compacts_by_default_past_half_its_window() -> None:
    small = EmbeddedChat(n_ctx=1024, seed=3, max_tokens=48)
    history = transcript(8)
    assert SPEC.compaction == Compaction()
    assert await small.estimate_tokens(history) > 512
    result = await run(SPEC, "And what is 42 plus 8?", small, tools={"add": add}, history=history)
    logged = [e.event for e in result.events if isinstance(e.event, Compacted | CompactionFailed)]
    assert [type(event) for event in logged] == [Compacted]
    (compacted,) = logged
    assert isinstance(compacted, Compacted)
    assert compacted.budget == 512
    assert compacted.usage.completion_tokens <= 128
    assert result.state.history[1] == compacted.message
    assert replay(result.events) == result.state
