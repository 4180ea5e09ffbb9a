"""EmbeddedChat streamed, on the real default model (SmolLM2-135M-Instruct), really
generating: the text as llama-cpp-python's `create_chat_completion(stream=True)` gives it,
and the response (usage too) the call makes unstreamed.

llama.cpp's reply to a prompt it has just answered (its whole prompt still cached) can
differ from its reply to the same prompt after another one, so each call here follows a
call with another prompt: the streamed and the unstreamed call start alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.providers.test_embedded import ADD, SYSTEM, ask, message_of, user
from turnkeeper.core import AgentSpec, ToolSpec
from turnkeeper.events import ModelResponded, TokenDelta
from turnkeeper.providers import DeltaSink, EmbeddedChat, streaming_to
from turnkeeper.sessions import run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

ELSE = ask(user("Name a colour."))


@pytest.fixture(scope="module")
def chat() -> EmbeddedChat:
    return EmbeddedChat(seed=5, max_tokens=48)


def same(response: dict[str, Any]) -> dict[str, Any]:
    """The response but for its id and time, which every call makes anew."""
    return {k: v for k, v in response.items() if k not in ("id", "created")}


async def both(chat: Any, request: dict[str, Any]) -> tuple[Any, Any, list[TokenDelta]]:
    """The unstreamed response, the streamed one, and the deltas of the latter."""
    await chat(ELSE)
    whole = await chat(request)
    await chat(ELSE)
    deltas: list[TokenDelta] = []
    with streaming_to(DeltaSink(deltas.append, "s", 2)):
        streamed = await chat(request)
    return whole, streamed, deltas


def content_of(deltas: list[TokenDelta]) -> str:
    last = max((d.attempt for d in deltas), default=1)
    return "".join(d.text for d in deltas if d.tool_call is None and d.attempt == last)


@pytest.mark.parametrize(
    "request_",
    [
        ask(user("Tell me about Paris in two sentences.")),  # ends at max_tokens
        ask(user("Count from one to five.")),
        ask(user("Tell me about Paris in two sentences."), stop=["."]),
        ask(user("Tell me about Paris."), stop=["the capital", "\n"]),
    ],
)
async def test_the_streamed_text_is_the_reply_and_the_response_is_the_unstreamed_one(
    chat: EmbeddedChat, request_: dict[str, Any]
) -> None:
    whole, streamed, deltas = await both(chat.complete, request_)
    assert same(streamed) == same(whole)
    text = message_of(whole)["content"]
    assert content_of(deltas) == text
    assert len(deltas) > 3
    assert {(d.attempt, d.tool_call) for d in deltas} == {(1, None)}
    assert [d.index for d in deltas] == list(range(len(deltas)))


async def test_a_stop_string_is_never_streamed(chat: EmbeddedChat) -> None:
    request = ask(user("Tell me about Paris in two sentences."), stop=[", "])
    whole, streamed, deltas = await both(chat.complete, request)
    assert same(streamed) == same(whole)
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert ", " not in "".join(d.text for d in deltas)


async def test_a_call_streams_its_tool_then_its_arguments(chat: EmbeddedChat) -> None:
    request = ask(SYSTEM, user("What is 17 plus 25?"), tools=[ADD])
    whole, streamed, deltas = await both(chat, request)
    assert same(streamed) == same(whole)
    [call] = message_of(whole)["tool_calls"]
    assert [(d.tool_call, d.name) for d in deltas if d.name] == [(0, "add")]
    assert "".join(d.text for d in deltas if d.tool_call == 0) == call["function"]["arguments"]
    assert json.loads(call["function"]["arguments"]) == {"a": 17, "b": 25}
    # Not the reply's JSON: nothing of it is sent as content.
    assert content_of(deltas) == ""


async def test_an_answer_streams_its_text_not_the_reply_json(chat: EmbeddedChat) -> None:
    request = ask(SYSTEM, user("What is 17 plus 25?"), tools=[ADD], tool_choice="none")
    whole, streamed, deltas = await both(chat, request)
    assert same(streamed) == same(whole)
    answer = message_of(whole)["content"]
    assert answer
    assert whole["turnkeeper"]["reply_text"].startswith("{")
    assert content_of(deltas) == answer
    if not whole["turnkeeper"]["unreadable"]:
        # Read as it came: many pieces, in one attempt.
        assert {d.attempt for d in deltas} == {1}
        assert len(deltas) > 1


async def test_a_run_on_the_embedded_model_streams_and_logs_what_it_logs_unstreamed(
    chat: EmbeddedChat,
) -> None:
    add = ToolSpec("add", ADD["function"]["description"], ADD["function"]["parameters"])
    spec = AgentSpec(system_prompt=SYSTEM["content"], tools=(add,), temperature=0.0)

    async def adding(a: int, b: int) -> str:
        return str(a + b)

    async def once(deltas: list[TokenDelta] | None) -> Any:
        await chat(ELSE)
        return await run(
            spec,
            "What is 17 plus 25?",
            chat,
            tools={"add": adding},
            session_id="e1",
            max_turns=3,
            clock=lambda: 1.0,
            on_delta=None if deltas is None else deltas.append,
        )

    plain = await once(None)
    deltas: list[TokenDelta] = []
    streamed = await once(deltas)

    def logged(result: Any) -> list[Any]:
        return [
            (e.seq, e.type, e.event.message if isinstance(e.event, ModelResponded) else e.event)
            for e in result.events
        ]

    assert logged(streamed) == logged(plain)
    assert replay(streamed.events) == streamed.state
    responses = [e for e in streamed.events if isinstance(e.event, ModelResponded)]
    assert sorted({d.after for d in deltas}) == [e.seq - 1 for e in responses]
