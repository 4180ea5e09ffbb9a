"""Small-model mode: resume, restate, corrections and the request window."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from turnkeeper.core import AgentSpec, GuardConfig, SmallModel, ToolResult, ToolSpec, ToolUse, Usage
from turnkeeper.events import DirectiveInjected
from turnkeeper.guards import (
    CONTINUE,
    GuardView,
    Reply,
    correct_reply,
    restate_request,
    resume_next_step,
    window,
)
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import RunResult, open_session, recheck, run
from turnkeeper.state import SessionState, replay

SPEC = AgentSpec(
    system_prompt="sys",
    tools=(ToolSpec("web_search"), ToolSpec("add_to_cart"), ToolSpec("finish")),
    terminal_tool="finish",
)
ON = GuardConfig(small_model=SmallModel(window_turns=2, max_result_chars=10))


def state_with(history: list[dict[str, Any]], **changes: Any) -> SessionState:
    state = open_session(SPEC, guards=ON)
    return msgspec.structs.replace(state, history=tuple(history), **changes)


def reply(text: str) -> Reply:
    return Reply({"role": "assistant", "content": text}, text, (), "stop", Usage())


def error_tool(text: str) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": "c1",
        "content": json.dumps({"error": text, "isError": True}),
    }


def test_reattached_transcript_ending_on_a_tool_result_resumes_with_next_step() -> None:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    state = state_with(history, resume=True)
    verdict = resume_next_step(GuardView("before_call", state, 0.0))
    assert [d.text for d in verdict.directives] == ["Continue with the next step for my request."]
    assert resume_next_step(GuardView("before_call", state_with(history), 0.0)) is CONTINUE
    off = msgspec.structs.replace(state, guards=GuardConfig())
    assert resume_next_step(GuardView("before_call", off, 0.0)) is CONTINUE


def test_request_is_restated_after_a_tool_step_only() -> None:
    state = state_with([{"role": "user", "content": "find x"}], request="find x")
    use = ToolUse("c1", "web_search", {})
    after_tools = GuardView("before_call", state, 0.0, results=((use, ToolResult("c1", "r")),))
    verdict = restate_request(after_tools)
    assert "My request: find x" in verdict.directives[0].text
    assert restate_request(GuardView("before_call", state, 0.0)) is CONTINUE


CART = AgentSpec(
    system_prompt="sys",
    tools=(ToolSpec("add"), ToolSpec("add_to_cart"), ToolSpec("web_search"), ToolSpec("finish")),
    terminal_tool="finish",
)


async def out_of_stock(item: str) -> str:
    raise LookupError(f"{item} is out of stock")


def corrections(result: RunResult) -> list[str]:
    return [
        e.event.text
        for e in result.events
        if isinstance(e.event, DirectiveInjected) and e.event.text.startswith("Correction: ")
    ]


@pytest.mark.anyio
async def test_a_reply_saying_a_failed_call_worked_is_sent_back_once_in_a_live_session() -> None:
    chat = ScriptedChat(
        [
            tool_response(("add_to_cart", {"item": "lamp"})),
            text_response("Added to cart!"),
            text_response("Added to cart!"),
        ]
    )
    tools = {"add_to_cart": out_of_stock}
    result = await run(CART, "Buy the lamp", chat, tools=tools, guards=ON)
    [correction] = corrections(result)
    assert "the last tool call failed: LookupError: lamp is out of stock." in correction
    assert "Don't say it worked" in correction
    # The model saw the correction after its reply, the restated request before it.
    sent = [m["content"][:12] for m in chat.requests[2]["messages"]]
    assert sent[-3:] == ["My request: ", "Added to car", "Correction: "]
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


@pytest.mark.anyio
async def test_a_reply_admitting_the_failure_stands() -> None:
    chat = ScriptedChat(
        [tool_response(("add_to_cart", {"item": "lamp"})), text_response("Sorry, it failed.")]
    )
    tools = {"add_to_cart": out_of_stock}
    result = await run(CART, "Buy the lamp", chat, tools=tools, guards=ON)
    assert (result.text, corrections(result)) == ("Sorry, it failed.", [])


@pytest.mark.anyio
async def test_a_failure_after_a_success_in_a_later_step_is_no_failure() -> None:
    async def search(q: str) -> str:
        return "lamps: 3"

    chat = ScriptedChat(
        [
            tool_response(("add_to_cart", {"item": "lamp"})),
            tool_response(("web_search", {"q": "lamp"})),
            text_response("There are 3 lamps."),
        ]
    )
    tools = {"add_to_cart": out_of_stock, "web_search": search}
    result = await run(CART, "Buy the lamp", chat, tools=tools, guards=ON)
    assert (result.text, corrections(result)) == ("There are 3 lamps.", [])


def transcript_failing_with(content: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "add_to_cart", "arguments": "{}"}}
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Buy the lamp"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": content},
    ]


@pytest.mark.anyio
async def test_a_reattached_transcripts_last_failure_is_remembered() -> None:
    history = transcript_failing_with(json.dumps({"error": "quota exceeded", "isError": True}))
    chat = ScriptedChat([text_response("Done! All set."), text_response("Done!")])
    result = await run(CART, None, chat, history=history, guards=ON)
    [correction] = corrections(result)
    assert "the last tool call failed: quota exceeded." in correction


@pytest.mark.anyio
async def test_a_failure_whose_error_is_not_text_is_quoted_as_the_result() -> None:
    content = json.dumps({"error": {"code": 429}, "isError": True})
    chat = ScriptedChat([text_response("Done!"), text_response("Done!")])
    result = await run(CART, None, chat, history=transcript_failing_with(content), guards=ON)
    [correction] = corrections(result)
    assert f"the last tool call failed: {content}." in correction


def test_a_tool_result_nested_too_deep_to_read_is_no_failure() -> None:
    deep = '{"error": ' + "[" * 100_000
    state = open_session(CART, history=transcript_failing_with(deep), guards=ON)
    assert state.last_failure is None
    assert state.error_counts == {}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("text", "tool"),
    [
        ("Please click Add to cart to buy it.", "add_to_cart"),
        ("Just click add to cart.", "add_to_cart"),
        ("You can use the web search tool for that.", "web_search"),
        ("Try calling web_search with your query.", "web_search"),
        ("Use the add tool to sum them.", "add"),
    ],
)
async def test_a_reply_that_pushes_a_tool_onto_the_user_is_sent_back(text: str, tool: str) -> None:
    chat = ScriptedChat([text_response(text), text_response("ok")])
    result = await run(CART, "buy it", chat, guards=ON)
    [correction] = corrections(result)
    assert f"call {tool} now" in correction


@pytest.mark.anyio
@pytest.mark.parametrize("text", ["Your address is on file.", "Additional charges apply."])
async def test_a_tool_name_inside_a_longer_word_is_no_push(text: str) -> None:
    chat = ScriptedChat([text_response("Use it: " + text)])
    result = await run(CART, "buy it", chat, guards=ON)
    assert corrections(result) == []


def test_a_plain_answer_is_left_alone() -> None:
    state = state_with(
        [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    )
    answer = reply("The answer is 42.")
    assert correct_reply(GuardView("after_response", state, 0.0, reply=answer)) is CONTINUE


def test_window_keeps_system_and_last_turns_from_a_user_turn_and_cuts_results() -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for turn in range(4):
        history += [
            {"role": "user", "content": f"u{turn}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{turn}",
                        "type": "function",
                        "function": {"name": "web_search", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "x" * 50},
        ]
    state = state_with(history)
    shown = window(state.history, state)
    assert shown[0] == {"role": "system", "content": "s"}
    assert [m["content"] for m in shown if m["role"] == "user"] == ["u2", "u3"]
    assert shown[1]["role"] == "user"
    assert all(m["content"] == "x" * 10 + " …(cut)" for m in shown if m["role"] == "tool")
    assert state.history[-1]["content"] == "x" * 50


@pytest.mark.parametrize("turns", [0, 1, 2, 5])
@pytest.mark.parametrize("window_turns", [1, 2, 5, 10**6])
def test_window_shows_as_many_turns_as_it_may_for_every_allowed_size(
    window_turns: int, turns: int
) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for turn in range(turns):
        history += [{"role": "user", "content": f"u{turn}"}, {"role": "assistant", "content": "a"}]
    config = GuardConfig(small_model=SmallModel(window_turns=window_turns, max_result_chars=1))
    state = msgspec.structs.replace(open_session(SPEC, guards=config), history=tuple(history))
    shown = window(state.history, state)
    kept = min(turns, window_turns)
    assert [m["content"] for m in shown if m["role"] == "user"] == [
        f"u{turn}" for turn in range(turns - kept, turns)
    ]
    assert shown == history[:1] + history[len(history) - 2 * kept :]


@pytest.mark.parametrize("window_turns", [0, -1, -5])
@pytest.mark.parametrize("turns", [1, 3])
def test_a_logged_window_under_one_turn_shows_the_last_turn(window_turns: int, turns: int) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for turn in range(turns):
        history += [{"role": "user", "content": f"u{turn}"}, {"role": "assistant", "content": "a"}]
    # As a log written before check_guards bounded window_turns may hold it.
    logged = msgspec.json.decode(
        msgspec.json.encode({"small_model": {"window_turns": window_turns}}), type=GuardConfig
    )
    state = msgspec.structs.replace(open_session(SPEC), guards=logged, history=tuple(history))
    assert window(state.history, state) == [history[0], *history[-2:]]


def test_the_smallest_window_cuts_results_to_one_character() -> None:
    config = GuardConfig(small_model=SmallModel(window_turns=1, max_result_chars=1))
    history = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "web_search", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "abc"},
    ]
    state = msgspec.structs.replace(open_session(SPEC, guards=config), history=tuple(history))
    assert window(state.history, state)[-1]["content"] == "a …(cut)"


@pytest.mark.anyio
async def test_run_in_small_model_mode_sends_a_window_and_logs_everything() -> None:
    chat = ScriptedChat(
        [tool_response(("web_search", {"q": str(i)})) for i in range(3)]
        + [text_response("found it")]
    )

    async def search(q: str) -> str:
        return f"result {q} " * 5

    result = await run(SPEC, "search three times", chat, tools={"web_search": search}, guards=ON)
    assert result.text == "found it"
    last_sent = chat.requests[-1]["messages"]
    assert last_sent[-1]["content"].startswith("My request: search three times")
    assert any(m["content"].endswith("…(cut)") for m in last_sent if m["role"] == "tool")
    full = [m for m in result.transcript if m["role"] == "tool"]
    assert all(not m["content"].endswith("…(cut)") for m in full)
    assert len(last_sent) < len(result.transcript)


@pytest.mark.anyio
async def test_a_reply_that_echoes_an_earlier_result_is_replaced_by_the_last_one() -> None:
    chat = ScriptedChat(
        [
            tool_response(("web_search", {"q": "monday"})),
            tool_response(("web_search", {"q": "today"})),
            text_response("Monday: rain"),
        ]
    )

    async def search(q: str) -> str:
        return {"monday": "Monday: rain", "today": "Today: sunny, 22 C"}[q]

    result = await run(SPEC, "weather today?", chat, tools={"web_search": search}, guards=ON)
    assert result.text == "Today: sunny, 22 C"
    assert result.transcript[-2]["content"] == "Monday: rain"
    assert result.transcript[-1] == {"role": "assistant", "content": "Today: sunny, 22 C"}
    assert [e.type for e in result.events][-1] == "local.reply_replaced"
    assert replay(result.events) == result.state
    assert recheck(result.events) is None
