"""Typed output on the embedded model (SmolLM2-135M really generating): the grammar made
from the output schema holds its replies to a call of an offered tool or an answer of the
schema, so `run()` gets a typed answer from a 135M model, and its JSON answer is never
taken for a tool call."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from turnkeeper.core import AgentSpec, ToolSpec, output_json_schema, validate
from turnkeeper.events import ModelResponded, OutputAccepted, ToolCalled
from turnkeeper.providers import EmbeddedChat
from turnkeeper.sessions import recheck, run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio


class City(msgspec.Struct):
    name: str
    country: str
    population: int


class Sum(msgspec.Struct):
    a: int
    b: int
    total: int


ADD = ToolSpec(
    "add",
    "Add two integers and return the sum.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


@pytest.fixture(scope="module")
def chat() -> EmbeddedChat:
    return EmbeddedChat(seed=3, max_tokens=64)


def replies(events: Any) -> list[dict[str, Any]]:
    """The embedded backend's record of each reply: its own text, and whether it read."""
    found = []
    for envelope in events:
        if isinstance(envelope.event, ModelResponded):
            found.append(msgspec.json.decode(envelope.event.response)["turnkeeper"])
    return found


async def test_the_model_answers_in_the_schema_of_a_struct(chat: EmbeddedChat) -> None:
    spec = AgentSpec(
        system_prompt="You give facts about cities.", output_schema=City, temperature=0.0
    )
    result = await run(spec, "Tell me about Paris.", chat, max_turns=3)
    assert (result.terminal, result.stop_reason) == ("end_turn", "end_turn")
    assert isinstance(result.output, City)
    assert isinstance(result.output.population, int)
    # One reply: the grammar let it write nothing but an answer call of the schema.
    (reply,) = replies(result.events)
    assert reply["unreadable"] is False
    written = msgspec.json.decode(reply["reply_text"])
    assert written["name"] == "final_answer"
    assert validate(output_json_schema(City) or {}, written["arguments"]) == []
    assert msgspec.json.decode(result.text or "") == written["arguments"]
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_with_a_tool_the_json_answer_is_not_a_call(chat: EmbeddedChat) -> None:
    """The model calls the tool, then answers with JSON of the schema (here after the loop
    guard withdraws the tools: a small model calls again rather than answer). Every call
    run is of the offered tool; the JSON answer was taken as the answer."""
    calls: list[tuple[int, int]] = []

    async def add(a: int, b: int) -> str:
        calls.append((a, b))
        return str(a + b)

    spec = AgentSpec(
        system_prompt="You are a helpful assistant. Use the tools to answer.",
        tools=(ADD,),
        output_schema=Sum,
        temperature=0.0,
    )
    result = await run(spec, "What is 17 plus 25?", chat, tools={"add": add}, max_turns=6)
    assert calls, "the model never called the tool"
    assert [e.event.name for e in result.events if isinstance(e.event, ToolCalled)] == [
        "add"
    ] * len(calls)
    written = [msgspec.json.decode(reply["reply_text"]) for reply in replies(result.events)]
    assert {reply["name"] for reply in written} <= {"add", "final_answer"}
    assert all(not reply["unreadable"] for reply in replies(result.events))
    assert (result.terminal, result.stop_reason) == ("end_turn", "end_turn")
    assert isinstance(result.output, Sum)
    (output,) = [e.event for e in result.events if isinstance(e.event, OutputAccepted)]
    assert written[-1] == {"name": "final_answer", "arguments": output.value}
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_the_bare_model_takes_openais_request_for_json(chat: EmbeddedChat) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }
    response = await chat.complete(
        {
            "messages": [{"role": "user", "content": "Give two numbers as JSON."}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "pair", "schema": schema},
            },
        }
    )
    text = response["choices"][0]["message"]["content"]
    assert validate(schema, msgspec.json.decode(text)) == []
