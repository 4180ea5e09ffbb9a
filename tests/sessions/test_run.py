"""run: the whole loop with in-process tools, on both anyio backends."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import pytest

from turnkeeper.core import AgentSpec, ChatError, InputError, ToolSpec, Usage
from turnkeeper.events import (
    Envelope,
    MessageReceived,
    ToolCalled,
    ToolReturned,
)
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import recheck, run
from turnkeeper.state import replay
from turnkeeper.tools import ToolContext

pytestmark = pytest.mark.anyio

ADD = ToolSpec(
    "add",
    "Add two numbers",
    {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)
FINISH = ToolSpec(
    "finish",
    "Give the answer",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
SPEC = AgentSpec(system_prompt="Use the tools.", tools=(ADD, FINISH), terminal_tool="finish")


async def add(a: float, b: float) -> str:
    return str(a + b)


def tool_messages(transcript: tuple[dict[str, Any], ...]) -> list[str]:
    return [m["content"] for m in transcript if m["role"] == "tool"]


async def test_runs_tools_until_the_model_answers() -> None:
    chat = ScriptedChat([tool_response(("add", {"a": 2, "b": 3})), text_response("2 + 3 = 5")])
    result = await run(SPEC, "What is 2 + 3?", chat, tools={"add": add})
    assert (result.terminal, result.stop_reason, result.text) == (
        "end_turn",
        "end_turn",
        "2 + 3 = 5",
    )
    assert result.turns == 2
    assert tool_messages(result.transcript) == ["5"]
    assert result.session_id.startswith("local_")
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_terminal_tool_result_and_no_further_model_call() -> None:
    chat = ScriptedChat(
        [tool_response(("add", {"a": 1, "b": 1})), tool_response(("finish", {"answer": "2"}))]
    )
    result = await run(SPEC, "1+1?", chat, tools={"add": add})
    assert (result.terminal, result.stop_reason) == ("end_turn", "terminal_tool")
    assert result.result == {"answer": "2"}
    assert chat.calls == 2


async def test_single_handler_gets_name_args_and_context() -> None:
    seen: list[tuple[str, dict[str, Any], ToolContext]] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append((name, args, ctx))
        return "7"

    chat = ScriptedChat([tool_response(("add", {"a": 3, "b": 4}, "c1")), text_response("7")])
    result = await run(SPEC, "3+4", chat, tools=handler, session_id="local_aaaaaaaaaaaaaaaa")
    assert seen == [("add", {"a": 3, "b": 4}, ToolContext("local_aaaaaaaaaaaaaaaa", "c1", "add"))]
    assert result.text == "7"


async def test_tool_call_is_logged_before_the_handler_runs() -> None:
    logged: list[str] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        logged.append("handler")
        return "x"

    def on_event(envelope: Envelope) -> None:
        logged.append(envelope.type)

    chat = ScriptedChat([tool_response(("add", {"a": 1, "b": 2})), text_response("x")])
    await run(SPEC, "go", chat, tools=handler, on_event=on_event)
    at = logged.index("handler")
    assert logged[at - 1] == "local.tool_call"
    assert logged[at + 1] == "local.tool_result"


async def test_async_on_event_sees_every_event_in_order() -> None:
    seqs: list[int] = []

    async def on_event(envelope: Envelope) -> None:
        await anyio.lowlevel.checkpoint()
        seqs.append(envelope.seq)

    chat = ScriptedChat([tool_response(("add", {"a": 1, "b": 2})), text_response("3")])
    result = await run(SPEC, "go", chat, tools={"add": add}, on_event=on_event)
    assert seqs == [e.seq for e in result.events] == list(range(1, len(result.events) + 1))


async def test_raising_handler_becomes_an_error_result() -> None:
    async def broken(a: float, b: float) -> str:
        raise RuntimeError("the adder is on fire")

    chat = ScriptedChat([tool_response(("add", {"a": 1, "b": 2})), text_response("sorry")])
    result = await run(SPEC, "go", chat, tools={"add": broken})
    assert json.loads(tool_messages(result.transcript)[0]) == {
        "error": "RuntimeError: the adder is on fire",
        "isError": True,
    }
    assert result.text == "sorry"


async def test_invalid_unknown_and_malformed_calls_are_answered_without_running() -> None:
    ran: list[str] = []

    async def counting(a: float, b: float) -> str:
        ran.append("add")
        return "3"

    chat = ScriptedChat(
        [
            tool_response(("add", {"a": "one", "b": 2}), ("nope", {}), ("add", "{broken")),
            text_response("done"),
        ]
    )
    result = await run(SPEC, "go", chat, tools={"add": counting})
    errors = [json.loads(c)["error"] for c in tool_messages(result.transcript)]
    assert ran == []
    assert "invalid arguments for add" in errors[0]
    assert "$.a" in errors[0]
    assert "unknown tool 'nope'" in errors[1]
    assert "not valid JSON" in errors[2]
    assert not any(isinstance(e.event, ToolCalled) for e in result.events)


async def test_tools_run_concurrently_up_to_the_limit_and_results_keep_call_order() -> None:
    running = 0
    peak = 0

    async def slow(a: float, b: float) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01 * (5 - a))
        running -= 1
        return str(a)

    calls = [("add", {"a": i, "b": 0}) for i in range(5)]
    chat = ScriptedChat([tool_response(*calls), text_response("ok")])
    result = await run(SPEC, "go", chat, tools={"add": slow}, tool_concurrency=2)
    assert peak == 2
    assert tool_messages(result.transcript) == ["0", "1", "2", "3", "4"]


async def test_tool_timeout_is_an_error_result() -> None:
    async def hang(a: float, b: float) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    chat = ScriptedChat([tool_response(("add", {"a": 1, "b": 2})), text_response("ok")])
    result = await run(SPEC, "go", chat, tools={"add": hang}, tool_timeout=0.05)
    assert "timed out after 0.05 s" in tool_messages(result.transcript)[0]


async def test_looping_model_is_stopped_with_the_gist_of_the_last_result() -> None:
    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        return tool_response(("add", {"a": 1, "b": 1}))

    result = await run(SPEC, "go", chat, tools={"add": add})
    assert (result.terminal, result.stop_reason) == ("terminated", "going_in_circles")
    assert result.turns == 3
    assert result.text is not None
    assert result.text.startswith("2")
    assert "going in circles" in result.text


async def test_max_turns_ends_the_run_with_the_last_result() -> None:
    counter = iter(range(100))

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        n = next(counter)
        return tool_response(("add", {"a": n, "b": 1000}))

    result = await run(SPEC, "go", chat, tools={"add": add}, max_turns=4)
    assert (result.terminal, result.stop_reason) == ("terminated", "max_turns_exceeded")
    assert result.turns == 4
    assert result.text is not None
    # The 4th call, asked for an answer with tools withdrawn, gave none: its call did not
    # run, and the halt holds the 3rd call's result.
    assert "1002" in result.text


async def test_require_terminal_tool_reprompts_then_gives_up() -> None:
    chat = ScriptedChat([text_response("a"), text_response("b"), text_response("c")])
    result = await run(SPEC, "go", chat, require_terminal_tool=True, max_reprompts=2)
    assert result.stop_reason == "no_terminal_tool"
    assert result.turns == 3


async def test_require_terminal_tool_accepts_a_late_finish() -> None:
    chat = ScriptedChat([text_response("4"), tool_response(("finish", {"answer": "4"}))])
    result = await run(SPEC, "go", chat, require_terminal_tool=True)
    assert result.result == {"answer": "4"}


async def test_turn_guard_halts_on_usage() -> None:
    def guard(usage: Usage, turns: int) -> str | None:
        return f"spent {usage.total_tokens} tokens" if usage.total_tokens >= 30 else None

    chat = ScriptedChat([tool_response(("add", {"a": i, "b": 0}), usage=(10, 5)) for i in range(5)])
    result = await run(SPEC, "go", chat, tools={"add": add}, turn_guard=guard)
    assert (result.stop_reason, result.text) == ("turn_guard", "spent 30 tokens")
    assert result.turns == 2
    assert replay(result.events) == result.state
    assert all(
        any(m.get("tool_call_id") == call["id"] for m in result.transcript)
        for msg in result.transcript
        if msg["role"] == "assistant"
        for call in msg.get("tool_calls") or []
    )


async def test_timeout_ends_the_run_and_keeps_the_log_consistent() -> None:
    async def slow_chat(request: dict[str, Any]) -> dict[str, Any]:
        if len(request["messages"]) > 2:
            await anyio.sleep(10)
        return tool_response(("add", {"a": 1, "b": 2}))

    result = await run(SPEC, "go", slow_chat, tools={"add": add}, timeout=0.2)
    assert (result.terminal, result.stop_reason) == ("terminated", "timeout")
    assert result.text is not None
    assert "3" in result.text
    assert replay(result.events) == result.state


async def test_chat_error_ends_the_run_with_a_reason() -> None:
    chat = ScriptedChat(
        [
            tool_response(("add", {"a": 1, "b": 2})),
            ChatError("HTTP 401", transient=False, status=401),
        ]
    )
    result = await run(SPEC, "go", chat, tools={"add": add})
    assert (result.terminal, result.stop_reason) == ("terminated", "chat_error")
    assert result.text is not None
    assert "HTTP 401" in result.text
    assert "3" in result.text
    assert [e.type for e in result.events[-2:]] == ["local.chat_error", "local.halted"]
    assert replay(result.events) == result.state


async def test_without_tools_the_run_returns_control_and_can_be_reattached() -> None:
    chat = ScriptedChat([tool_response(("add", {"a": 2, "b": 2})), text_response("4")])
    first = await run(SPEC, "2+2", chat)
    assert first.terminal == "requires_action"
    assert [u.name for u in first.tool_uses] == ["add"]
    second = await run(SPEC, None, chat, tools={"add": add}, history=first.transcript)
    assert second.text == "4"
    assert second.state.resume
    assert tool_messages(second.transcript) == ["4"]


ASK = ToolSpec("ask_human", "Ask a person", {"type": "object"})


async def test_a_call_of_a_tool_the_mapping_does_not_name_returns_control() -> None:
    spec = AgentSpec(system_prompt="Use the tools.", tools=(ADD, ASK))
    both = tool_response(("add", {"a": 1, "b": 2}, "c1"), ("ask_human", {"q": "ok?"}, "c2"))
    chat = ScriptedChat([both, text_response("3, and yes")])
    first = await run(spec, "1+2, then ask", chat, tools={"add": add})
    assert (first.terminal, first.stop_reason) == ("requires_action", "tool_use")
    assert [u.id for u in first.tool_uses] == ["c1", "c2"]
    assert not any(e.type == "local.tool_call" for e in first.events)  # none ran
    assert replay(first.events) == first.state

    async def ask_human(q: str) -> str:
        return "yes"

    tools: dict[str, Callable[..., Any]] = {"add": add, "ask_human": ask_human}
    second = await run(spec, None, chat, tools=tools, history=first.transcript)
    assert second.text == "3, and yes"
    assert tool_messages(second.transcript) == ["3", "yes"]


async def test_bad_calls_are_answered_by_the_run_even_without_tools() -> None:
    # As a Host does: a call that would be refused is answered with the error, not handed
    # back; the model repairs it and the good call comes back to the caller.
    chat = ScriptedChat(
        [
            tool_response(("multiply", {"a": 2}, "bad")),
            tool_response(("add", {"a": 2, "b": 2}, "good")),
        ]
    )
    result = await run(SPEC, "2+2", chat)
    assert result.terminal == "requires_action"
    assert [u.id for u in result.tool_uses] == ["good"]
    assert "unknown tool" in tool_messages(result.transcript)[0]
    assert replay(result.events) == result.state


async def test_a_plain_function_in_the_mapping_runs_and_its_result_reaches_the_model() -> None:
    charged: list[float] = []

    def plain_add(a: float, b: float) -> str:
        charged.append(a + b)
        return str(a + b)

    chat = ScriptedChat([tool_response(("add", {"a": 2, "b": 5})), text_response("7")])
    result = await run(SPEC, "2+5", chat, tools={"add": plain_add})
    assert charged == [7]
    assert tool_messages(result.transcript) == ["7"]
    returned = [e.event for e in result.events if isinstance(e.event, ToolReturned)]
    assert [r.is_error for r in returned] == [False]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"tool_timeout": -1}, "tool_timeout"),
        ({"tool_timeout": math.nan}, "tool_timeout"),
        ({"tool_timeout": "1"}, "tool_timeout"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": math.nan}, "timeout"),
        ({"tool_concurrency": 1.5}, "tool_concurrency"),
        ({"tool_concurrency": None}, "tool_concurrency"),
        ({"on_event": 5}, "on_event"),
        ({"on_delta": "print"}, "on_delta"),
        ({"approve": True}, "approve"),
        ({"turn_guard": 1}, "turn_guard"),
        ({"guard": None}, "guard"),
        ({"clock": 1.0}, "clock"),
    ],
)
async def test_bad_options_are_refused_before_any_model_call(
    options: dict[str, Any], named: str
) -> None:
    chat = ScriptedChat([tool_response(("add", {"a": 1, "b": 1})), text_response("2")])
    with pytest.raises(InputError, match=f"^{named}: expected"):
        await run(SPEC, "1+1", chat, tools={"add": add}, **options)
    assert chat.requests == []


async def test_handler_returning_json_values_and_unencodable_values() -> None:
    async def structured(a: float, b: float) -> Any:
        return {"sum": a + b} if a else object()

    chat = ScriptedChat(
        [tool_response(("add", {"a": 1, "b": 2}), ("add", {"a": 0, "b": 2})), text_response("ok")]
    )
    result = await run(SPEC, "go", chat, tools={"add": structured})
    first, second = tool_messages(result.transcript)
    assert json.loads(first) == {"sum": 3}
    assert "not text" in json.loads(second)["error"]
    returned = {
        e.event.tool_call_id: e.event.is_error
        for e in result.events
        if isinstance(e.event, ToolReturned)
    }
    ids = [call["id"] for call in result.transcript[2]["tool_calls"]]
    assert [returned[i] for i in ids] == [False, True]


async def hang(request: dict[str, Any]) -> dict[str, Any]:
    await anyio.sleep(3600)
    raise AssertionError("the model call was not cut short")


async def test_a_timeout_during_the_first_model_call_logs_the_opening_and_the_prompt() -> None:
    recorded: list[Envelope] = []
    result = await run(SPEC, "What is 2 + 3?", hang, timeout=0.05, on_event=recorded.append)
    assert (result.terminal, result.stop_reason) == ("terminated", "timeout")
    assert [e.type for e in recorded] == [
        "local.session_opened",
        "local.user_message",
        "local.halted",
    ]
    assert recorded[1].event == MessageReceived(text="What is 2 + 3?")
    assert recorded == list(result.events)
    assert replay(recorded) == result.state
    assert recheck(recorded) is None


async def test_a_failed_first_model_call_logs_the_prompt_before_the_failure() -> None:
    chat = ScriptedChat([ChatError("HTTP 400: no such model", transient=False, status=400)])
    result = await run(SPEC, "What is 2 + 3?", chat)
    assert (result.terminal, result.stop_reason) == ("terminated", "chat_error")
    assert [e.type for e in result.events] == [
        "local.session_opened",
        "local.user_message",
        "local.chat_error",
        "local.halted",
    ]
    assert result.events[1].event == MessageReceived(text="What is 2 + 3?")
    assert replay(result.events) == result.state
    assert result.state.history[-1] == {"role": "user", "content": "What is 2 + 3?"}
    assert recheck(result.events) is None


async def test_a_run_cancelled_during_its_first_model_call_has_logged_the_prompt() -> None:
    recorded: list[Envelope] = []
    entered = anyio.Event()

    async def entering(request: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        return await hang(request)

    async with anyio.create_task_group() as group:
        group.start_soon(partial(run, SPEC, "What is 2 + 3?", entering, on_event=recorded.append))
        await entered.wait()
        group.cancel_scope.cancel()
    assert [e.type for e in recorded] == ["local.session_opened", "local.user_message"]
    state = replay(recorded)
    assert state.in_poll
    assert state.history[-1] == {"role": "user", "content": "What is 2 + 3?"}
    assert recheck(recorded) is None


async def test_a_timeout_lets_on_event_take_every_event_of_a_step_so_its_log_has_no_gap() -> None:
    recorded: list[Envelope] = []

    async def slow_to_record(envelope: Envelope) -> None:
        if envelope.type == "local.model_response":
            await anyio.sleep(0.5)  # the run's timeout passes meanwhile
        recorded.append(envelope)

    twice = ("add", {"a": 1, "b": 2})
    chat = ScriptedChat([tool_response(twice, twice), hang])
    result = await run(SPEC, "go", chat, tools={"add": add}, timeout=0.1, on_event=slow_to_record)
    assert result.stop_reason == "timeout"
    assert "local.duplicate_tool_call" in [e.type for e in recorded]
    assert [e.seq for e in recorded] == list(range(1, len(recorded) + 1))
    assert recorded == list(result.events)
    assert replay(recorded) == result.state
