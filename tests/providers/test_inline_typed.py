"""Inline tools with a request for JSON of a schema (a session's `output_schema`): the
schema becomes `final_answer`'s arguments in the prompt and the grammar, and the answer
comes back as its JSON text, never mistaken for a tool call."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import ToolSpec, output_json_schema, validate
from turnkeeper.providers import ScriptedChat, text_response
from turnkeeper.providers._inline import (
    ANSWER_TOOL,
    InlineTools,
    inline_request,
    inline_response,
)

ADD = ToolSpec(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
).to_openai()


class Weather(msgspec.Struct):
    city: str
    temperature: int


class Node(msgspec.Struct):
    value: int
    children: list[Node] = []


WEATHER = output_json_schema(Weather)


def typed(schema: Any, *, tools: list[dict[str, Any]] | None = None, **more: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Go"}],
        "tools": [ADD] if tools is None else tools,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        },
        **more,
    }


def answered(text: str, request: dict[str, Any]) -> dict[str, Any]:
    response = inline_response(text_response(text), request)
    message: dict[str, Any] = response["choices"][0]["message"]
    return message


def test_the_schema_is_final_answers_arguments_in_the_prompt_and_the_grammar() -> None:
    sent = inline_request(typed(WEATHER), grammar=True)
    prompt = sent["messages"][0]["content"]
    assert (
        "- final_answer(city: string, temperature: integer): Give the user your final answer"
        in prompt
    )
    assert "call final_answer with it, or reply with it in plain text" not in prompt
    schema = sent["response_format"]["schema"]
    assert sent["response_format"]["type"] == "json_object"
    answer = {"name": "final_answer", "arguments": {"city": "Paris", "temperature": 12}}
    assert validate(schema, answer) == []
    assert validate(schema, {"name": "final_answer", "arguments": {"text": "Paris"}}) != []
    assert validate(schema, {"name": "add", "arguments": {"a": 1, "b": 2}}) == []


def test_without_tools_the_reply_is_the_answer_call_alone() -> None:
    sent = inline_request(typed(WEATHER, tools=[]), grammar=True)
    prompt = sent["messages"][0]["content"]
    assert prompt == (
        "Be terse.\n\nReply with your final answer to the user's request, as only this JSON "
        'object:\n{"name": "final_answer", "arguments": {"city": <string>, "temperature": '
        "<integer>}}"
    )
    schema = sent["response_format"]["schema"]
    assert (
        validate(schema, {"name": "final_answer", "arguments": {"city": "P", "temperature": 1}})
        == []
    )
    assert validate(schema, {"name": "add", "arguments": {"a": 1, "b": 2}}) != []


def test_without_a_grammar_the_request_for_json_is_not_passed_on() -> None:
    """The call format replaces it: a server given both would constrain the reply to the
    answer's schema, and no call could be made."""
    sent = inline_request(typed(WEATHER), grammar=False)
    assert "response_format" not in sent
    assert "call final_answer with it." in sent["messages"][0]["content"]


def test_a_recursive_schemas_definitions_move_to_the_grammars_root() -> None:
    schema = output_json_schema(Node)
    sent = inline_request(typed(schema), grammar=True)
    grammar = sent["response_format"]["schema"]
    assert set(grammar["$defs"]) == {"Node"}
    tree = {"value": 1, "children": [{"value": 2, "children": []}]}
    assert validate(grammar, {"name": "final_answer", "arguments": tree}) == []
    assert validate(grammar, {"name": "final_answer", "arguments": {"value": "x"}}) != []


def test_a_schema_that_is_not_an_object_is_under_answer() -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    request = typed(schema, tools=[])
    grammar = inline_request(request, grammar=True)["response_format"]["schema"]
    assert validate(grammar, {"name": "final_answer", "arguments": {"answer": [1, 2]}}) == []
    message = answered('{"name": "final_answer", "arguments": {"answer": [1, 2]}}', request)
    assert (message["content"], message.get("tool_calls")) == ("[1, 2]", None)


@pytest.mark.parametrize(
    ("text", "content"),
    [
        # The answer call, in the grammar's shape: its arguments are the answer, as JSON.
        (
            '{"name": "final_answer", "arguments": {"city": "Paris", "temperature": 12}}',
            '{"city": "Paris", "temperature": 12}',
        ),
        # An answer written as the JSON itself, even with a `name` (and arguments-like keys),
        # is the answer as written, fenced or not.
        ('{"name": "Ada", "age": 36}', '{"name": "Ada", "age": 36}'),
        ('{"name": "Ada", "arguments": {"x": 1}}', '{"name": "Ada", "arguments": {"x": 1}}'),
        ('```json\n{"city": "Paris"}\n```', '{"city": "Paris"}'),
        ("[1, 2, 3]", "[1, 2, 3]"),
    ],
)
def test_a_json_answer_is_the_content_never_a_call(text: str, content: str) -> None:
    message = answered(text, typed(WEATHER))
    assert message.get("tool_calls") is None
    assert message["content"] == content


def test_a_call_of_an_offered_tool_is_still_a_call() -> None:
    request = typed(WEATHER)
    response = inline_response(
        text_response('{"name": "add", "arguments": {"a": 2, "b": 3}}'), request
    )
    choice = response["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "add",
        {"a": 2, "b": 3},
    )


def test_an_answer_call_in_tags_is_the_answer_too() -> None:
    call = '{"name": "final_answer", "arguments": {"city": "Oslo", "temperature": -3}}'
    text = f"<tool_call>{call}</tool_call>"
    message = answered(text, typed(WEATHER))
    assert message.get("tool_calls") is None
    assert json.loads(message["content"]) == {"city": "Oslo", "temperature": -3}


def test_prose_stays_prose_for_the_session_to_judge() -> None:
    message = answered("It is 12 degrees in Paris.", typed(WEATHER))
    assert (message["content"], message.get("tool_calls")) == ("It is 12 degrees in Paris.", None)


def test_a_request_without_a_schema_is_as_before() -> None:
    plain = {"model": "m", "messages": [{"role": "user", "content": "Go"}], "tools": [ADD]}
    sent = inline_request(plain, grammar=True)
    assert '"text"' in json.dumps(sent["response_format"]["schema"])
    message = answered('{"name": "final_answer", "arguments": {"text": "5"}}', plain)
    assert message["content"] == "5"


@pytest.mark.anyio
async def test_inline_tools_round_trip() -> None:
    backend = ScriptedChat(
        [
            text_response(
                '{"name": "final_answer", "arguments": {"city": "Rome", "temperature": 20}}'
            )
        ]
    )
    response = await InlineTools(backend, grammar=True)(typed(WEATHER))
    assert response["choices"][0]["message"]["content"] == '{"city": "Rome", "temperature": 20}'
    sent = backend.requests[0]
    assert sent["response_format"]["type"] == "json_object"
    assert ANSWER_TOOL in json.dumps(sent["response_format"]["schema"])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["name", "arguments", "city", "a"]), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300)
@given(JSON)
def test_any_json_reply_is_a_call_of_an_offered_tool_or_the_answer(value: Any) -> None:
    """A reply that is one JSON value becomes a call only when it is written as a call of an
    offered tool; otherwise it is the answer, and its JSON reads back as what was meant."""
    text = json.dumps(value)
    response = inline_response(text_response(text), typed(WEATHER))
    message = response["choices"][0]["message"]
    calls = message.get("tool_calls")
    if calls:
        assert isinstance(value, dict)
        assert value.get("name") == "add"
        return
    content = message["content"]
    is_answer_call = (
        isinstance(value, dict)
        and value.get("name") == ANSWER_TOOL
        and "arguments" in value
        and isinstance(value["arguments"], dict)
    )
    assert json.loads(content) == (value["arguments"] if is_answer_call else value)
