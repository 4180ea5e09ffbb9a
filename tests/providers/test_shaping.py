"""Request-shaping chat wrappers: tool ranking, prompt fitting, and the step timeout."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, ChatError, InputError, ToolSpec
from turnkeeper.events import ChatFailed
from turnkeeper.providers import ScriptedChat, text_response
from turnkeeper.providers._shaping import (
    approx_tokens,
    with_prompt_fitting,
    with_step_timeout,
    with_tool_ranking,
)
from turnkeeper.sessions import Kickoff, open_session, poll_turn

LONG = "Explains at length what this tool is for and how. " * 20


def tool(name: str, description: str = "", **parameters: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": parameters}
    return ToolSpec(name, description, schema).to_openai()


TOOLS = [
    tool("search_products", "Search the catalogue", query={"type": "string"}),
    tool("get_weather", "Current weather in a city", city={"type": "string", "description": LONG}),
    tool("clock", "The current time"),
    tool("add_to_cart", "Put an item in the cart", product_id={"type": "string"}),
    tool("translate", "Translate text", text={"type": "string"}),
    tool("send_email", "Send an email", to={"type": "string"}),
]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def calls(*names: str, start: int = 1) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"c{start + i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
            for i, n in enumerate(names)
        ],
    }


def answer(call_id: str, text: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def request(messages: list[dict[str, Any]], tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "tools": tools, "temperature": 0.2}


def sent_names(chat: ScriptedChat) -> list[str]:
    return [t["function"]["name"] for t in chat.requests[-1]["tools"]]


class Recorder:
    """A backend that keeps the very request objects it is sent."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        return text_response("done")


# tool ranking


@pytest.mark.anyio
async def test_ranking_sends_the_best_tools_in_their_order() -> None:
    chat = ScriptedChat([text_response("ok")])
    given = request([{"role": "system", "content": "s"}, user("add the weather to my cart")])
    kept = copy.deepcopy(given)
    await with_tool_ranking(chat, max_tools=2)(given)
    assert sent_names(chat) == ["get_weather", "add_to_cart"]
    assert given == kept  # the caller's request is not changed
    sent = chat.requests[0]
    assert {k: v for k, v in sent.items() if k != "tools"} == {
        k: v for k, v in given.items() if k != "tools"
    }


@pytest.mark.anyio
async def test_ranking_compacts_long_schemas_and_keeps_short_ones() -> None:
    chat = ScriptedChat([text_response("ok")])
    await with_tool_ranking(chat, max_tools=2)(request([user("weather or time?")]))
    weather, clock = chat.requests[0]["tools"]
    city = weather["function"]["parameters"]["properties"]["city"]
    assert city["type"] == "string"
    assert len(city["description"]) < len(LONG)
    assert clock == TOOLS[2]


@pytest.mark.anyio
async def test_ranking_favours_the_tools_the_history_just_called() -> None:
    chat = ScriptedChat([text_response("ok")])
    history = [user("help"), calls("translate", "clock"), answer("c1"), answer("c2")]
    await with_tool_ranking(chat, max_tools=1)(request([*history, user("and now?")]))
    assert sent_names(chat) == ["clock"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("max_tools", "sent"),
    [
        (1, ["send_email"]),
        (2, ["add_to_cart", "send_email"]),
        (3, ["get_weather", "add_to_cart", "send_email"]),
    ],
)
async def test_ranking_keeps_the_function_tool_choice_names(
    max_tools: int, sent: list[str]
) -> None:
    chat = ScriptedChat([text_response("ok")])
    named = {"type": "function", "function": {"name": "send_email"}}
    asked = {**request([user("add the weather to my cart")]), "tool_choice": named}
    await with_tool_ranking(chat, max_tools=max_tools)(asked)
    assert sent_names(chat) == sent
    assert chat.requests[0]["tool_choice"] == named


@pytest.mark.anyio
async def test_fitting_keeps_the_function_tool_choice_names() -> None:
    chat = Recorder()
    named = {"type": "function", "function": {"name": "send_email"}}
    asked = {**request([user("what is the weather in Paris?")]), "tool_choice": named}
    fits_one = per_item([asked["messages"][0]], TOOLS[:1]) + 5
    await fitting(chat, fits_one)(asked)
    assert [tool["function"]["name"] for tool in chat.requests[0]["tools"]] == ["send_email"]


@pytest.mark.anyio
async def test_ranking_leaves_a_request_without_tools_alone() -> None:
    chat = Recorder()
    given = {"model": "m", "messages": [user("hi")]}
    await with_tool_ranking(chat)(given)
    assert chat.requests == [given]
    assert chat.requests[0] is given


@pytest.mark.anyio
async def test_ranking_reports_a_tool_it_cannot_read() -> None:
    chat = Recorder()
    shaped = with_tool_ranking(chat, max_tools=1)
    with pytest.raises(ChatError, match=r"request tools\[1\]: expected a function tool") as caught:
        await shaped(request([user("x")], [TOOLS[0], {"type": "retrieval"}]))
    assert caught.value.transient is False
    assert chat.requests == []


# prompt fitting


def per_item(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """10 tokens a message and 100 a tool: sizes a test can work out by hand."""
    return 10 * len(messages) + 100 * len(tools)


def fitting(chat: Any, window: int) -> Any:
    return with_prompt_fitting(chat, context_window=window, count_tokens=per_item, reply_tokens=0)


@pytest.mark.anyio
async def test_a_request_that_fits_is_sent_as_it_is() -> None:
    chat = Recorder()
    given = request([user("hi")])
    await fitting(chat, 10 + 600)(given)
    assert chat.requests[0] is given


@pytest.mark.anyio
@pytest.mark.parametrize(("window", "tools"), [(599, 4), (399, 2), (199, 1)])
async def test_tools_are_cut_to_the_best_4_2_then_1(window: int, tools: int) -> None:
    chat = Recorder()
    await fitting(chat, window)(request([user("what is the weather")]))
    [sent] = chat.requests
    names = [t["function"]["name"] for t in sent["tools"]]
    assert len(names) == tools
    assert "get_weather" in names
    assert sent["messages"] == [user("what is the weather")]


HISTORY = [
    {"role": "system", "content": "s"},
    user("u1"),
    {"role": "assistant", "content": "a1"},
    user("u2"),
    calls("clock", "translate"),
    answer("c1"),
    answer("c2"),
    {"role": "assistant", "content": "a2"},
    user("u3"),
    calls("clock", start=3),
    answer("c3"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("window", "kept"),
    [
        # 11 messages and 1 tool = 210 tokens; each step drops the oldest turn that may go.
        (209, [0, 3, 4, 5, 6, 7, 8, 9, 10]),  # u1, and a1, which would lead
        (189, [0, 8, 9, 10]),  # u2, and its tool step and a2, which would lead
        (139, [0, 8]),  # then the newest user turn's own tool step
    ],
)
async def test_oldest_turns_are_dropped_whole(window: int, kept: list[int]) -> None:
    chat = Recorder()
    await fitting(chat, window)(request(HISTORY, TOOLS[:1]))
    assert chat.requests[0]["messages"] == [HISTORY[i] for i in kept]


@pytest.mark.anyio
async def test_too_long_even_at_the_least_is_a_permanent_chat_error() -> None:
    chat = Recorder()
    with pytest.raises(ChatError) as caught:
        await fitting(chat, 119)(request(HISTORY))
    assert (
        caught.value.message
        == "prompt too long: 120 tokens for a 119 token window (0 of it kept for the reply)"
    )
    assert caught.value.transient is False
    assert chat.requests == []


@pytest.mark.anyio
async def test_the_reply_keeps_max_tokens_or_reply_tokens_of_the_window() -> None:
    chat = Recorder()
    shaped = with_prompt_fitting(chat, context_window=1000, count_tokens=per_item, reply_tokens=500)
    await shaped(request([user("weather")]))  # 610 tokens: 5 tools do not fit 500
    assert len(chat.requests[-1]["tools"]) == 4
    await shaped({**request([user("weather")]), "max_tokens": 390})
    assert len(chat.requests[-1]["tools"]) == 6
    with pytest.raises(ChatError, match="prompt too long: 110 tokens for a 1000 token window"):
        await shaped({**request([user("weather")]), "max_tokens": 999})


@pytest.mark.anyio
async def test_a_prompt_too_long_is_logged_as_a_chat_error_and_the_state_stays() -> None:
    state = open_session(AgentSpec(system_prompt="Be brief.", tools=(ToolSpec("clock"),)))
    model = ScriptedChat([text_response("never")])
    shaped = with_prompt_fitting(model, context_window=8, count_tokens=approx_tokens)
    with pytest.raises(ChatError) as caught:
        await poll_turn(state, Kickoff("What time is it?"), shaped)
    [failed] = [e.event for e in caught.value.events if isinstance(e.event, ChatFailed)]
    assert failed.error.startswith("prompt too long: ")
    assert failed.transient is False
    assert model.calls == 0


def test_approx_tokens_is_json_bytes_over_4_rounded_up() -> None:
    messages = [user("héllo")]
    size = len(json.dumps([messages, TOOLS[:1]], ensure_ascii=False, separators=(",", ":")))
    assert approx_tokens(messages, TOOLS[:1]) == math.ceil((size + 1) / 4)
    assert approx_tokens([], []) == 2
    assert approx_tokens([*messages, user("more")], []) > approx_tokens(messages, [])


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A history: maybe a system message, then user turns, replies, and tool steps (an
    assistant's calls answered by tool messages); sometimes a leading orphan answer."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(st.text(max_size=40))})
    if draw(st.booleans()):
        messages.append(answer("c0", "left over"))
    number = 1
    for kind in draw(st.lists(st.sampled_from(["user", "text", "calls"]), max_size=14)):
        if kind == "user":
            messages.append(user(draw(st.text(max_size=40))))
        elif kind == "text":
            messages.append({"role": "assistant", "content": draw(st.text(max_size=40))})
        else:
            count = draw(st.integers(1, 3))
            names = [draw(st.sampled_from(["clock", "translate"])) for _ in range(count)]
            messages.append(calls(*names, start=number))
            messages.extend(
                answer(f"c{number + i}", draw(st.text(max_size=40))) for i in range(count)
            )
            number += count
    return messages


def blocks(messages: list[dict[str, Any]]) -> list[list[int]]:
    """Indexes of each assistant's calls with the tool messages right after it."""
    found: list[list[int]] = []
    for index, message in enumerate(messages):
        if message.get("tool_calls"):
            found.append([index])
        elif message["role"] == "tool" and found and found[-1][-1] == index - 1:
            found[-1].append(index)
    return found


@settings(max_examples=150, deadline=None)
@given(conversations(), st.floats(0.3, 1.1), st.sampled_from(["asyncio", "trio"]))
def test_fitting_keeps_system_newest_user_and_whole_tool_steps(
    messages: list[dict[str, Any]], share: float, backend: str
) -> None:
    chat = Recorder()
    tools = [TOOLS[2], TOOLS[4]]  # small, so the history decides what fits
    given = request(messages, tools)
    # 256 tokens are kept for the reply; the prompt gets a share of what it needs.
    window = 256 + int(share * approx_tokens(messages, tools))
    shaped = with_prompt_fitting(chat, context_window=window, count_tokens=approx_tokens)

    async def attempt() -> ChatError | None:
        try:
            await shaped(given)
        except ChatError as error:
            return error
        return None

    error = anyio.run(attempt, backend=backend)
    if error is not None:
        assert error.message.startswith("prompt too long: ")
        return
    sent = chat.requests[0]
    kept = sent["messages"]
    assert approx_tokens(kept, sent["tools"]) <= window - 256
    ids = [id(m) for m in messages]
    positions = [ids.index(id(m)) for m in kept]
    assert positions == sorted(positions)  # a subsequence, in order
    for index, message in enumerate(messages):
        if message["role"] == "system":
            assert index in positions
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if users:
        assert users[-1] in positions
    if users and len(kept) < len(messages):
        first = next(m for m in kept if m["role"] != "system")
        assert first["role"] == "user"
    for block in blocks(messages):
        assert all(i in positions for i in block) or not any(i in positions for i in block)


# step timeout


class Hanging:
    """A backend whose generation never ends, and that notes when it is cancelled."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = False

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        raise AssertionError("sleep_forever returned")


@pytest.mark.anyio
async def test_a_step_that_takes_too_long_is_a_transient_chat_error() -> None:
    model = Hanging()
    with pytest.raises(ChatError) as caught:
        await with_step_timeout(model, 0.01)(request([user("hi")]))
    assert caught.value.message == "the model took longer than 0.01 s"
    assert caught.value.transient is True
    assert model.cancelled


@pytest.mark.anyio
async def test_a_step_in_time_returns_the_response() -> None:
    chat = ScriptedChat([text_response("fine")])
    response = await with_step_timeout(chat, 60)(request([user("hi")]))
    assert response == text_response("fine")


@pytest.mark.anyio
async def test_cancelling_the_session_cancels_the_generation_without_an_error() -> None:
    model = Hanging()
    timed = with_step_timeout(model, 3600)

    async def step() -> None:
        await timed(request([user("hi")]))

    async with anyio.create_task_group() as group:
        group.start_soon(step)
        await model.started.wait()
        group.cancel_scope.cancel()
    assert model.cancelled


@pytest.mark.anyio
async def test_a_timed_out_poll_logs_a_chat_error_and_leaves_the_state() -> None:
    state = open_session(AgentSpec(system_prompt="Be brief."))
    with pytest.raises(ChatError) as caught:
        await poll_turn(state, Kickoff("hi"), with_step_timeout(Hanging(), 0.01))
    [failed] = [e.event for e in caught.value.events if isinstance(e.event, ChatFailed)]
    assert failed.error == "the model took longer than 0.01 s"
    assert failed.transient is True


# settings


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "8"])
def test_max_tools_must_be_a_positive_int(value: Any) -> None:
    with pytest.raises(InputError, match="with_tool_ranking: max_tools must be an int >= 1"):
        with_tool_ranking(Recorder(), max_tools=value)


@pytest.mark.parametrize("value", [-1, 1.5, None, False])
def test_window_sizes_must_be_ints(value: Any) -> None:
    with pytest.raises(InputError, match="context_window must be an int >= 0"):
        with_prompt_fitting(Recorder(), context_window=value, count_tokens=approx_tokens)
    with pytest.raises(InputError, match="reply_tokens must be an int >= 0"):
        with_prompt_fitting(
            Recorder(), context_window=10, count_tokens=approx_tokens, reply_tokens=value
        )


def test_count_tokens_must_be_callable() -> None:
    with pytest.raises(InputError, match="count_tokens must be callable"):
        with_prompt_fitting(Recorder(), context_window=10, count_tokens=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, True, "5"])
def test_the_step_timeout_must_be_a_positive_number(value: Any) -> None:
    with pytest.raises(InputError, match="with_step_timeout: seconds must be a finite number > 0"):
        with_step_timeout(Recorder(), value)
