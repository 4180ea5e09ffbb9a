"""Inline tools: the request and response transformations, and InlineTools around a backend."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import ChatError, ToolSpec, validate
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.providers._inline import (
    RESULT_CHARS,
    InlineTools,
    answer_prompt,
    inline_request,
    inline_response,
    reply_schema,
    with_answer_tool,
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
LOOKUP = ToolSpec(
    "lookup",
    "Look up a fact.",
    {
        "type": "object",
        "properties": {
            "key": {"type": "string", "description": "what to look up"},
            "unit": {"enum": ["c", "f"]},
        },
        "required": ["key"],
    },
).to_openai()
FINISH = ToolSpec(
    "finish",
    "Give the final answer.",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
).to_openai()


def request(*messages: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": list(messages) or [{"role": "user", "content": "What is 2 plus 3?"}],
        "tools": [ADD, LOOKUP] if tools is None else tools,
        "temperature": 0.5,
    }


def reply(text: str, finish_reason: str = "stop") -> dict[str, Any]:
    return text_response(text, finish_reason=finish_reason, usage=(30, 7))


def message_of(response: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = response["choices"][0]["message"]
    return message


def calls_of(response: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for call in message_of(response).get("tool_calls") or []
    ]


SYSTEM = {"role": "system", "content": "You are terse."}
ASK = {"role": "user", "content": "What is 2 plus 3?"}


# requests


def test_tools_move_into_the_system_prompt_with_format_and_worked_example() -> None:
    sent = inline_request(request(SYSTEM, ASK), grammar=False)
    assert "tools" not in sent
    assert sent["model"] == "m"
    assert sent["temperature"] == 0.5
    assert "response_format" not in sent
    system = sent["messages"][0]
    assert system["role"] == "system"
    prompt = system["content"]
    assert prompt.startswith("You are terse.\n\nYou can use these tools:")
    assert "- add(a: integer, b: integer): Add two integers." in prompt
    assert '- lookup(key: string, unit?: "c" | "f"): Look up a fact.' in prompt
    assert "    key: what to look up" in prompt
    assert "- final_answer(text: string): Give the user your final answer." in prompt
    assert (
        'For example, to call add: {"name": "add", "arguments": {"a": <integer>, "b": <integer>}}'
        in prompt
    )
    assert prompt.endswith("call final_answer with it, or reply with it in plain text.")
    assert sent["messages"][1:] == [ASK]


def test_a_system_message_is_added_when_there_is_none() -> None:
    sent = inline_request(request(ASK, tools=[LOOKUP]), grammar=True)
    assert [message["role"] for message in sent["messages"]] == ["system", "user"]
    prompt = sent["messages"][0]["content"]
    assert prompt.startswith("You can use these tools:")
    assert 'to call lookup: {"name": "lookup", "arguments": {"key": <string>}}' in prompt
    assert prompt.endswith("When you know the final answer, call final_answer with it.")


def test_a_real_final_answer_tool_is_listed_once_and_called_as_a_tool() -> None:
    own = ToolSpec("final_answer", "Report.", {"type": "object"}).to_openai()
    asked = request(ASK, tools=[own])
    sent = inline_request(asked, grammar=True)
    assert sent["messages"][0]["content"].count("- final_answer") == 1
    schema = sent["response_format"]["schema"]
    assert validate(schema, {"name": "final_answer", "arguments": {"x": 1}}) == []
    response = inline_response(reply('{"name": "final_answer", "arguments": {"x": 1}}'), asked)
    assert calls_of(response) == [("final_answer", {"x": 1})]


def test_tool_choice_fields_are_not_forwarded() -> None:
    asked = {**request(ASK), "tool_choice": "auto", "parallel_tool_calls": False}
    sent = inline_request(asked, grammar=False)
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(sent)


def test_the_request_is_not_modified() -> None:
    asked = request(SYSTEM, ASK)
    before = json.dumps(asked, sort_keys=True)
    inline_request(asked, grammar=True)
    assert json.dumps(asked, sort_keys=True) == before


def test_grammar_constrains_the_reply_to_a_valid_call_or_an_answer() -> None:
    sent = inline_request(request(SYSTEM, ASK), grammar=True)
    assert sent["response_format"]["type"] == "json_object"
    schema = sent["response_format"]["schema"]
    assert schema == reply_schema(with_answer_tool([ADD["function"], LOOKUP["function"]]))
    assert validate(schema, {"name": "add", "arguments": {"a": 2, "b": 3}}) == []
    assert validate(schema, {"name": "lookup", "arguments": {"key": "x", "unit": "c"}}) == []
    assert validate(schema, {"name": "final_answer", "arguments": {"text": "5"}}) == []
    assert validate(schema, {"name": "final_answer", "arguments": {}})
    assert validate(schema, {"name": "add", "arguments": {"a": "2", "b": 3}})
    assert validate(schema, {"name": "add", "arguments": {"a": 2}})
    assert validate(schema, {"name": "subtract", "arguments": {"a": 2, "b": 3}})
    assert validate(schema, {"name": "add", "arguments": {"a": 2, "b": 3}, "x": 1})
    assert validate(schema, {"answer": "5"})


def test_a_tool_without_parameters_takes_empty_arguments() -> None:
    bare: dict[str, Any] = {"type": "function", "function": {"name": "now"}}
    schema = reply_schema([bare["function"]])
    assert validate(schema, {"name": "now", "arguments": {}}) == []
    prompt = inline_request(request(ASK, tools=[bare]), grammar=False)["messages"][0]["content"]
    assert "- now()" in prompt
    assert 'For example, to call now: {"name": "now", "arguments": {}}' in prompt


def test_final_turn_without_terminal_tool_constrains_to_an_answer() -> None:
    last = {
        "role": "user",
        "content": "This is your last turn. Finish now: answer with what you already have, "
        "and do not call any more tools.",
    }
    schema = inline_request(request(SYSTEM, ASK, last), grammar=True)["response_format"]["schema"]
    assert validate(schema, {"name": "final_answer", "arguments": {"text": "5"}}) == []
    assert validate(schema, {"name": "add", "arguments": {"a": 2, "b": 3}})


def test_final_turn_allows_the_terminal_tool_it_names() -> None:
    last = {
        "role": "user",
        "content": "This is your last turn. Finish now: call `finish` with your final answer, "
        "using what you already have.",
    }
    asked = request(SYSTEM, ASK, last, tools=[ADD, FINISH])
    schema = inline_request(asked, grammar=True)["response_format"]["schema"]
    assert validate(schema, {"name": "finish", "arguments": {"answer": "5"}}) == []
    assert validate(schema, {"name": "add", "arguments": {"a": 2, "b": 3}})
    assert validate(schema, {"name": "final_answer", "arguments": {"text": "5"}})


def test_tool_choice_none_withdraws_the_tools_and_admits_only_an_answer() -> None:
    called = tool_response(("add", {"a": 2, "b": 3}, "c1"))["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "c1", "content": "5"}
    for tools in ([ADD, LOOKUP], []):
        asked = {**request(SYSTEM, ASK, called, result, tools=tools), "tool_choice": "none"}
        sent = inline_request(asked, grammar=True)
        prompt = sent["messages"][0]["content"]
        assert prompt == f"You are terse.\n\n{answer_prompt(results=True)}"
        assert "from the results above" in prompt
        schema = sent["response_format"]["schema"]
        assert validate(schema, {"name": "final_answer", "arguments": {"text": "5"}}) == []
        assert validate(schema, {"name": "add", "arguments": {"a": 2, "b": 3}})
        assert sent["messages"][2] == {
            "role": "assistant",
            "content": '{"name": "add", "arguments": {"a": 2, "b": 3}}',
        }
        answered = inline_response(
            reply('{"name": "final_answer", "arguments": {"text": "It is 5."}}'), asked
        )
        assert message_of(answered) == {"role": "assistant", "content": "It is 5."}
        assert answered["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_none_on_a_fresh_question_asks_for_the_answer_alone() -> None:
    sent = inline_request({**request(ASK), "tool_choice": "none"}, grammar=False)
    assert sent["messages"][0]["content"] == answer_prompt(results=False)
    assert "results" not in sent["messages"][0]["content"]
    assert "response_format" not in sent


def test_tool_choice_none_surfaces_no_call_even_unconstrained() -> None:
    asked = {**request(ASK), "tool_choice": "none"}
    text = 'Sure. {"name": "add", "arguments": {"a": 2, "b": 3}}'
    response = inline_response(reply(text), asked)
    assert message_of(response) == {"role": "assistant", "content": text}
    assert response["choices"][0]["finish_reason"] == "stop"
    own = ToolSpec("final_answer", "Report.", {"type": "object"}).to_openai()
    mine = {**request(ASK, tools=[own]), "tool_choice": "none"}
    answer = '{"name": "final_answer", "arguments": {"text": "5"}}'
    assert message_of(inline_response(reply(answer), mine))["content"] == "5"


def test_tool_choice_required_admits_only_the_real_tools() -> None:
    asked = {**request(SYSTEM, ASK), "tool_choice": "required"}
    sent = inline_request(asked, grammar=True)
    prompt = sent["messages"][0]["content"]
    assert "final_answer" not in prompt
    assert prompt.endswith("Call one of these tools now.")
    schema = sent["response_format"]["schema"]
    assert schema == reply_schema([ADD["function"], LOOKUP["function"]])
    assert validate(schema, {"name": "final_answer", "arguments": {"text": "5"}})


def test_a_named_tool_choice_admits_that_function_alone() -> None:
    named = {"type": "function", "function": {"name": "lookup"}}
    asked = {**request(SYSTEM, ASK), "tool_choice": named}
    sent = inline_request(asked, grammar=True)
    prompt = sent["messages"][0]["content"]
    assert "- lookup(" in prompt
    assert "- add(" not in prompt
    assert "final_answer" not in prompt
    assert sent["response_format"]["schema"] == reply_schema([LOOKUP["function"]])
    assert "tool_choice" not in sent


def test_a_final_turn_under_auto_still_constrains_to_an_answer() -> None:
    last = {"role": "user", "content": "This is your last turn. Finish now."}
    asked = {**request(SYSTEM, ASK, last), "tool_choice": "auto"}
    sent = inline_request(asked, grammar=True)
    assert sent["response_format"]["schema"] == reply_schema(with_answer_tool([]))
    assert "- add(" in sent["messages"][0]["content"]


@pytest.mark.parametrize(
    ("choice", "tools", "why"),
    [
        ("sometimes", None, "tool_choice: expected"),
        ({"type": "function"}, None, "tool_choice: expected"),
        ({"type": "function", "function": {"name": "nope"}}, None, "'nope' is not among"),
        ("required", [], 'tool_choice "required": the request has no tools'),
    ],
)
def test_a_bad_tool_choice_is_a_permanent_chat_error(
    choice: Any, tools: list[dict[str, Any]] | None, why: str
) -> None:
    with pytest.raises(ChatError, match=re.escape(why)) as caught:
        inline_request({**request(ASK, tools=tools), "tool_choice": choice}, grammar=True)
    assert caught.value.transient is False


def test_history_calls_and_results_become_plain_turns() -> None:
    called = tool_response(("add", {"a": 2, "b": 3}, "c1"), ("lookup", '{"key": "x', "c2"))
    long_result = "x" * (RESULT_CHARS + 10)
    sent = inline_request(
        request(
            SYSTEM,
            ASK,
            message_of(called),
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
            {"role": "tool", "tool_call_id": "c2", "content": long_result},
            {"role": "user", "content": "Go on."},
        ),
        grammar=False,
    )
    assert sent["messages"][1:] == [
        ASK,
        {
            "role": "assistant",
            "content": '{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
            '{"name": "lookup", "arguments": {}}',
        },
        {
            "role": "user",
            "content": f"Result of add: 5\n\nResult of lookup: {'x' * RESULT_CHARS}"
            "… [cut: 10 more characters]\n\nGo on.",
        },
    ]


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param("[" * 100_000, id="arrays 100k deep"),
        pytest.param('{"a":' * 65 + "1" + "}" * 65, id="objects 65 deep"),
    ],
)
def test_history_calls_with_arguments_nested_too_deep_show_empty_arguments(
    arguments: str,
) -> None:
    called = tool_response(("add", arguments, "c1"))
    answered = {"role": "tool", "tool_call_id": "c1", "content": "bad arguments"}
    sent = inline_request(request(SYSTEM, ASK, message_of(called), answered), grammar=False)
    assert sent["messages"][2:] == [
        {"role": "assistant", "content": '{"name": "add", "arguments": {}}'},
        {"role": "user", "content": "Result of add: bad arguments"},
    ]


def test_assistant_text_beside_calls_is_kept_and_parts_are_flattened() -> None:
    called = tool_response(("add", {"a": 1, "b": 1}, "c1"), content="Adding.")
    parts = {"role": "user", "content": [{"type": "text", "text": "What is "}, {"text": "1+1?"}]}
    sent = inline_request(request(parts, message_of(called)), grammar=False)
    assert sent["messages"][1:] == [
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": 'Adding.\n{"name": "add", "arguments": {"a": 1, "b": 1}}'},
    ]


def test_without_tools_only_the_history_is_rewritten() -> None:
    called = tool_response(("add", {"a": 1, "b": 1}, "c1"))
    result = {"role": "tool", "tool_call_id": "c1", "content": "2"}
    sent = inline_request(request(ASK, message_of(called), result, tools=[]), grammar=True)
    assert "response_format" not in sent
    assert sent["messages"] == [
        ASK,
        {"role": "assistant", "content": '{"name": "add", "arguments": {"a": 1, "b": 1}}'},
        {"role": "user", "content": "Result of add: 2"},
    ]


# responses


def test_a_call_becomes_an_openai_tool_call() -> None:
    asked = request(ASK)
    response = inline_response(reply('{"name": "add", "arguments": {"a": 2, "b": 3}}'), asked)
    message = message_of(response)
    assert message["content"] is None
    assert calls_of(response) == [("add", {"a": 2, "b": 3})]
    [call] = message["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert response["choices"][0]["finish_reason"] == "tool_calls"
    assert response["usage"] == {"prompt_tokens": 30, "completion_tokens": 7}
    assert response["turnkeeper"] == {
        "reply_text": '{"name": "add", "arguments": {"a": 2, "b": 3}}',
        "unreadable": False,
    }


def test_call_ids_are_deterministic_and_distinct() -> None:
    text = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": {}}]'
    first = inline_response(reply(text), request(ASK))
    again = inline_response(reply(text), request(ASK))
    later = inline_response(reply(text), request(ASK, {"role": "user", "content": "More."}))
    ids = [call["id"] for call in message_of(first)["tool_calls"]]
    assert len(set(ids)) == 2
    assert ids == [call["id"] for call in message_of(again)["tool_calls"]]
    assert not set(ids) & {call["id"] for call in message_of(later)["tool_calls"]}


def test_a_final_answer_call_becomes_the_content() -> None:
    text = '{"name": "final_answer", "arguments": {"text": "It is 5."}}'
    response = inline_response(reply(text), request(ASK))
    assert message_of(response) == {"role": "assistant", "content": "It is 5."}
    assert response["choices"][0]["finish_reason"] == "stop"
    assert response["turnkeeper"]["reply_text"] == text
    odd = '{"name": "final_answer", "arguments": {"sum": 5}}'
    assert message_of(inline_response(reply(odd), request(ASK)))["content"] == '{"sum": 5}'


def test_a_final_answer_beside_calls_is_their_content() -> None:
    text = (
        '[{"name": "add", "arguments": {"a": 1, "b": 2}}, '
        '{"name": "final_answer", "arguments": {"text": "Adding."}}]'
    )
    response = inline_response(reply(text), request(ASK))
    assert message_of(response)["content"] == "Adding."
    assert calls_of(response) == [("add", {"a": 1, "b": 2})]
    assert response["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("answer", ["final_answer", " final_answer. ", '"add"', "add"])
def test_an_answer_that_is_only_a_tool_name_is_flagged_unreadable(answer: str) -> None:
    text = json.dumps({"name": "final_answer", "arguments": {"text": answer}})
    response = inline_response(reply(text), request(ASK))
    assert message_of(response)["content"] == answer
    assert response["turnkeeper"] == {"reply_text": text, "unreadable": True}
    named = inline_response(reply(json.dumps({"answer": "add it"})), request(ASK))
    assert named["turnkeeper"]["unreadable"] is False


def test_an_answer_object_becomes_the_content() -> None:
    response = inline_response(reply('{"answer": "It is 5."}'), request(ASK))
    assert message_of(response) == {"role": "assistant", "content": "It is 5."}
    assert response["choices"][0]["finish_reason"] == "stop"
    structured = inline_response(reply('{"answer": {"sum": 5}}'), request(ASK))
    assert message_of(structured)["content"] == '{"sum": 5}'


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"answer": ' + "[" * 100_000 + "]" * 100_000 + "}", id="100k deep"),
        pytest.param('{"answer": ' + "[" * 200 + "]" * 200 + "}", id="200 deep"),
    ],
)
def test_an_answer_nested_too_deep_stays_prose(text: str) -> None:
    response = inline_response(reply(text), request(ASK))
    assert message_of(response) == {"role": "assistant", "content": text}
    assert response["choices"][0]["finish_reason"] == "stop"


def test_a_call_with_arguments_nested_too_deep_is_unreadable() -> None:
    text = '{"name": "add", "arguments": ' + '{"a": ' * 65 + "1" + "}" * 66
    response = inline_response(reply(text), request(ASK))
    assert message_of(response) == {"role": "assistant", "content": text}
    assert response["turnkeeper"] == {"reply_text": text, "unreadable": True}


def test_prose_stays_content_beside_a_call() -> None:
    text = 'Let me add. {"name": "add", "arguments": {"a": 2, "b": 3}}'
    response = inline_response(reply(text), request(ASK))
    assert message_of(response)["content"] == "Let me add."
    assert calls_of(response) == [("add", {"a": 2, "b": 3})]


def test_plain_prose_is_a_final_answer() -> None:
    response = inline_response(reply("It is 5."), request(ASK))
    assert message_of(response) == {"role": "assistant", "content": "It is 5."}
    assert response["choices"][0]["finish_reason"] == "stop"
    assert response["turnkeeper"]["unreadable"] is False


def test_an_unreadable_call_stays_content_and_is_flagged() -> None:
    text = '{"name": "add", "arguments": {"a": 2, "b":'
    response = inline_response(reply(text, finish_reason="length"), request(ASK))
    assert message_of(response)["content"] == text
    assert "tool_calls" not in message_of(response)
    assert response["choices"][0]["finish_reason"] == "length"
    assert response["turnkeeper"] == {"reply_text": text, "unreadable": True}


@pytest.mark.parametrize(
    "response",
    [
        tool_response(("add", {"a": 1, "b": 1})),
        {"error": "no choices"},
        {"choices": []},
        {"choices": [{"message": "text"}]},
        {"choices": [{"message": {"role": "assistant", "content": None}}]},
    ],
)
def test_native_calls_and_malformed_responses_pass_through(response: dict[str, Any]) -> None:
    assert inline_response(response, request(ASK)) is response


def test_a_reply_to_a_request_without_tools_is_not_parsed() -> None:
    response = reply('{"name": "add", "arguments": {"a": 1, "b": 1}}')
    assert inline_response(response, request(ASK, tools=[])) is response


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@settings(deadline=None)
@given(
    name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True).filter(
        lambda name: name != "final_answer"
    ),
    arguments=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_any_call_in_the_reply_format_is_read_back_exactly(
    name: str, arguments: dict[str, Any]
) -> None:
    text = json.dumps({"name": name, "arguments": arguments})
    response = inline_response(reply(text), request(ASK))
    assert calls_of(response) == [(name, arguments)]
    assert message_of(response)["content"] is None


@settings(deadline=None)
@given(st.text(max_size=300))
def test_any_reply_gives_a_well_formed_response(text: str) -> None:
    response = inline_response(reply(text), request(ASK))
    message = message_of(response)
    assert response["turnkeeper"]["reply_text"] == text
    calls = message.get("tool_calls") or []
    assert len({call["id"] for call in calls}) == len(calls)
    for call in calls:
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert response["choices"][0]["finish_reason"] == ("tool_calls" if calls else "stop")
    assert message["content"] is None or isinstance(message["content"], str)


# InlineTools around a backend


@pytest.mark.anyio
async def test_inline_tools_sends_the_inline_request_and_returns_parsed_calls() -> None:
    backend = ScriptedChat([reply('{"name": "add", "arguments": {"a": 2, "b": 3}}')])
    chat = InlineTools(backend, grammar=True)
    assert chat.grammar is True
    response = await chat(request(SYSTEM, ASK))
    [sent] = backend.requests
    assert sent == inline_request(request(SYSTEM, ASK), grammar=True)
    assert calls_of(response) == [("add", {"a": 2, "b": 3})]


@pytest.mark.anyio
async def test_inline_tools_without_grammar_sends_no_response_format() -> None:
    backend = ScriptedChat([reply("It is 5.")])
    response = await InlineTools(backend)(request(SYSTEM, ASK))
    assert "response_format" not in backend.requests[0]
    assert message_of(response)["content"] == "It is 5."
