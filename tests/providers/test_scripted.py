"""ScriptedChat and the response builders text_response and tool_response."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import ChatError, InputError, TurnkeeperError, Usage
from turnkeeper.providers import ScriptedChat, ScriptExhausted, text_response, tool_response


def request(*contents: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": content} for content in contents]
    return {"model": "m", "messages": messages, "tools": []}


def call_ids(response: dict[str, Any]) -> list[str]:
    return [call["id"] for call in response["choices"][0]["message"]["tool_calls"]]


# builders


def test_text_response_is_chat_completions_shaped() -> None:
    assert text_response("Hello.") == {
        "choices": [
            {"message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}
        ]
    }


def test_text_response_takes_finish_reason_and_usage() -> None:
    response = text_response("Hel", finish_reason="length", usage=(12, 3))
    assert response["choices"][0]["finish_reason"] == "length"
    assert response["usage"] == {"prompt_tokens": 12, "completion_tokens": 3}
    assert text_response("x", usage=Usage(5, 7))["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 7,
    }


def test_tool_response_is_chat_completions_shaped() -> None:
    response = tool_response(
        ("read_file", {"path": "a.txt"}),
        ("search", '{"q": "broken', "my_id"),
        content="Let me look.",
        usage=(40, 9),
    )
    assert response == {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "Let me look.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "read_file", "arguments": '{"path":"a.txt"}'},
                        },
                        {
                            "id": "my_id",
                            "type": "function",
                            "function": {"name": "search", "arguments": '{"q": "broken'},
                        },
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 9},
    }


def test_tool_response_content_defaults_to_none_and_arguments_round_trip() -> None:
    arguments = {"path": "ü/a b.txt", "lines": [1, 2], "deep": {"x": None}}
    response = tool_response(("read_file", arguments))
    message = response["choices"][0]["message"]
    assert message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == arguments


def test_builder_output_encodes_as_json() -> None:
    response = tool_response(("a", {}), ("b", {}), usage=(1, 1))
    assert msgspec.json.decode(msgspec.json.encode(response)) == response
    assert json.loads(json.dumps(response)) == response


# Typed loosely: these calls break the signatures on purpose.
loose_tool: Any = tool_response
loose_text: Any = text_response


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tool_response(), "give at least one"),
        (lambda: loose_tool("read_file"), r"call 1 must be \(name, arguments\)"),
        (lambda: loose_tool(("a", {}), ("b",)), r"call 2 must be \(name, arguments\)"),
        (lambda: tool_response(("", {})), "call 1: the name must be a non-empty str"),
        (lambda: loose_tool(("a", [1])), r"call 1 \(a\): arguments must be a dict or a JSON"),
        (lambda: tool_response(("a", {"x": object()})), r"call 1 \(a\): arguments are not JSON"),
        (lambda: loose_tool(("a", {}, 7)), r"call 1 \(a\): the id must be a non-empty str"),
        (lambda: loose_tool(("a", {}), content=3), "content must be a str or None"),
        (lambda: loose_text(None), "text must be a str"),
        (lambda: loose_text("x", usage=(1,)), "usage must be a Usage or"),
        (lambda: text_response("x", usage=(1, -2)), "usage must be a Usage or"),
        (lambda: loose_tool(("a", {}), usage=(1.5, 2)), "usage must be a Usage or"),
    ],
)
def test_builders_reject_bad_input_clearly(build: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        build()


# playback


@pytest.mark.anyio
async def test_plays_back_responses_in_order_and_records_requests() -> None:
    first, second = text_response("one"), text_response("two")
    chat = ScriptedChat([first, second])
    assert chat.remaining == 2
    assert await chat(request("a")) is first
    assert await chat(request("a", "b")) is second
    assert chat.calls == 2
    assert chat.remaining == 0
    assert chat.requests == [request("a"), request("a", "b")]


@pytest.mark.anyio
async def test_recorded_requests_are_copies() -> None:
    chat = ScriptedChat([text_response("ok")])
    sent = request("hello")
    await chat(sent)
    sent["messages"].append({"role": "user", "content": "later"})
    sent["model"] = "other"
    assert chat.requests == [request("hello")]


@pytest.mark.anyio
async def test_exceptions_are_raised_in_order() -> None:
    busy = ChatError("HTTP 503", transient=True, status=503)
    broken = ValueError("backend bug")
    chat = ScriptedChat([busy, text_response("ok"), broken])
    with pytest.raises(ChatError) as raised:
        await chat(request("1"))
    assert raised.value is busy
    assert (await chat(request("2")))["choices"][0]["message"]["content"] == "ok"
    with pytest.raises(ValueError, match="backend bug"):
        await chat(request("3"))
    assert chat.calls == 3


@pytest.mark.anyio
async def test_sync_and_async_callables_receive_the_request() -> None:
    seen: list[dict[str, Any]] = []

    def echo(req: dict[str, Any]) -> dict[str, Any]:
        seen.append(req)
        return text_response(f"you said {req['messages'][-1]['content']}")

    async def count(req: dict[str, Any]) -> dict[str, Any]:
        seen.append(req)
        return text_response(f"{len(req['messages'])} messages")

    chat = ScriptedChat([echo, count])
    first = await chat(request("hi"))
    second = await chat(request("hi", "there"))
    assert first["choices"][0]["message"]["content"] == "you said hi"
    assert second["choices"][0]["message"]["content"] == "2 messages"
    assert seen == [request("hi"), request("hi", "there")]
    assert seen == chat.requests


@pytest.mark.anyio
async def test_a_callable_may_raise() -> None:
    def refuse(req: dict[str, Any]) -> dict[str, Any]:
        raise ChatError("HTTP 400: context too long", transient=False, status=400)

    chat = ScriptedChat([refuse])
    with pytest.raises(ChatError, match="context too long"):
        await chat(request("x"))


@pytest.mark.anyio
async def test_a_callable_that_returns_no_dict_is_named() -> None:
    def forgot_to_return(req: dict[str, Any]) -> None:
        pass

    chat = ScriptedChat([text_response("ok"), forgot_to_return])  # type: ignore[list-item]
    await chat(request("a"))
    with pytest.raises(InputError, match=r"script item 1 \(.*forgot_to_return\) returned NoneType"):
        await chat(request("b"))


@pytest.mark.anyio
async def test_a_request_that_is_no_dict_is_a_clear_error() -> None:
    chat = ScriptedChat([text_response("ok")])
    with pytest.raises(InputError, match="a request must be a dict, got list"):
        await chat([])  # type: ignore[arg-type]


# running out


@pytest.mark.anyio
async def test_running_out_raises_script_exhausted_naming_count_and_last_message() -> None:
    chat = ScriptedChat([text_response("one"), text_response("two")])
    await chat(request("a"))
    await chat(request("b"))
    with pytest.raises(ScriptExhausted) as raised:
        await chat(request("c", "what now?"))
    error = raised.value
    assert isinstance(error, TurnkeeperError)
    assert "had 2 responses" in str(error)
    assert "{'role': 'user', 'content': 'what now?'}" in str(error)
    assert error.scripted == 2
    assert error.request == request("c", "what now?")
    with pytest.raises(ScriptExhausted):
        await chat(request("d"))
    assert chat.calls == 4


@pytest.mark.anyio
async def test_an_empty_script_and_a_request_without_messages() -> None:
    chat = ScriptedChat([])
    with pytest.raises(ScriptExhausted, match=r"had 0 responses.*has no messages"):
        await chat({"model": "m"})


@pytest.mark.anyio
async def test_a_long_last_message_is_shortened_in_the_error() -> None:
    chat = ScriptedChat([])
    with pytest.raises(ScriptExhausted) as raised:
        await chat(request("x" * 5_000))
    assert len(str(raised.value)) < 600
    assert str(raised.value).endswith("...")


# script validation


@pytest.mark.parametrize(
    ("responses", "message"),
    [
        (text_response("hi"), r"not one response dict; wrap it in a list"),
        ([text_response("hi"), ChatError], r"item 1 is the exception class ChatError; pass an"),
        ([text_response("hi"), "hello"], "item 1 is a str; each item must be a response dict"),
        ([None], "item 0 is a NoneType"),
        (5, "responses must be a list of responses, got 5"),
    ],
)
def test_bad_scripts_are_clear_errors(responses: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        ScriptedChat(responses)


# tool-call ids


@pytest.mark.anyio
async def test_tool_call_ids_are_unique_across_the_script() -> None:
    again = tool_response(("poll", {}))
    chat = ScriptedChat(
        [
            tool_response(("read", {"p": 1}), ("read", {"p": 2})),
            lambda req: tool_response(("write", {}), ("write", {}, "mine")),
            again,
            again,
        ]
    )
    ids = [call_ids(await chat(request(str(n)))) for n in range(4)]
    assert ids == [["call_1", "call_2"], ["call_3", "mine"], ["call_4"], ["call_5"]]
    assert call_ids(again) == ["call_1"]


@pytest.mark.anyio
async def test_hand_written_responses_are_returned_untouched() -> None:
    no_id = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "a", "arguments": ""}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    malformed: dict[str, Any] = {"choices": "nope"}
    chat = ScriptedChat([no_id, malformed, {}])
    assert await chat(request("a")) is no_id
    assert await chat(request("b")) is malformed
    assert await chat(request("c")) == {}


@pytest.mark.anyio
@given(st.lists(st.integers(1, 4), max_size=12))
@settings(max_examples=200, deadline=None)
async def test_every_played_back_tool_call_id_is_unique(calls_per_turn: list[int]) -> None:
    chat = ScriptedChat(
        [tool_response(*[("t", {"i": i}) for i in range(n)]) for n in calls_per_turn]
    )
    ids = [i for _ in calls_per_turn for i in call_ids(await chat(request("go")))]
    assert len(ids) == sum(calls_per_turn)
    assert len(set(ids)) == len(ids)
    assert chat.remaining == 0
