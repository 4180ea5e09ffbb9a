"""End to end: `run` on the embedded model (SmolLM2-135M) with a real tool and the CLI's guards."""

from __future__ import annotations

from typing import Any

import pytest

from turnkeeper.core import AgentSpec, GuardConfig, SmallModel, ToolSpec
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    Halted,
    ModelResponded,
    ToolCalled,
    ToolReturned,
)
from turnkeeper.providers import EmbeddedChat
from turnkeeper.sessions import run

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
# How a session may end cleanly: an answer, a terminal tool, or a guard's stop.
CLEAN_STOPS = {"end_turn", "terminal_tool", "going_in_circles"}


@pytest.fixture(scope="module")
def chat() -> EmbeddedChat:
    return EmbeddedChat(seed=3, max_tokens=48)


@pytest.mark.anyio
async def test_the_model_calls_a_real_tool_and_the_session_ends_cleanly(
    chat: EmbeddedChat,
) -> None:
    calls: list[tuple[int, int]] = []

    async def add(a: int, b: int) -> str:
        calls.append((a, b))
        return str(a + b)

    chat_requests: list[dict[str, Any]] = []

    async def recording(request: dict[str, Any]) -> dict[str, Any]:
        chat_requests.append(request)
        return await chat(request)

    result = await run(
        SPEC,
        "What is 17 plus 25?",
        recording,
        tools={"add": add},
        max_turns=6,
        guards=GuardConfig(small_model=SmallModel()),
    )

    assert calls, "the model never called the tool"
    events = [envelope.event for envelope in result.events]
    called = [event for event in events if isinstance(event, ToolCalled)]
    returned = [event for event in events if isinstance(event, ToolReturned)]
    assert [event.name for event in called] == ["add"] * len(called)
    assert [(event.input["a"], event.input["b"]) for event in called] == calls
    assert [event.text for event in returned] == [str(a + b) for a, b in calls]
    assert not any(event.is_error for event in returned)
    # Each result went into the history, answering its call, and the model saw it.
    for event in returned:
        answer = {"role": "tool", "tool_call_id": event.tool_call_id, "content": event.text}
        assert answer in result.transcript
        assert any(answer in request["messages"] for request in chat_requests[1:])
    assert len(chat_requests) == result.turns >= 2
    assert sum(isinstance(event, ModelResponded) for event in events) == result.turns

    assert result.stop_reason != "max_turns_exceeded"
    assert result.stop_reason in CLEAN_STOPS, result.stop_reason
    assert result.terminal in ("end_turn", "terminated")
    assert result.text is not None
    assert str(calls[-1][0] + calls[-1][1]) in result.text
    halts = [event for event in events if isinstance(event, Halted)]
    assert all(halt.reason != "max_turns_exceeded" for halt in halts)


@pytest.mark.anyio
async def test_the_last_allowed_poll_answers_from_the_result_with_tools_withdrawn(
    chat: EmbeddedChat,
) -> None:
    # Two model calls allowed: the tool call, then the answer after max_turns' stop, made
    # with tools withdrawn, which the embedded backend's grammar holds to an answer.
    requests: list[dict[str, Any]] = []

    async def recording(request: dict[str, Any]) -> dict[str, Any]:
        requests.append(request)
        return await chat(request)

    async def add(a: int, b: int) -> str:
        return str(a + b)

    result = await run(
        SPEC,
        "What is 17 plus 25?",
        recording,
        tools={"add": add},
        max_turns=2,
        guards=GuardConfig(small_model=SmallModel()),
    )
    events = [envelope.event for envelope in result.events]
    assert [type(event) for event in events if isinstance(event, ToolCalled)] == [ToolCalled]
    asked = [event for event in events if isinstance(event, AnswerRequested)]
    assert [(event.guard, event.reason) for event in asked] == [("max_turns", "max_turns_exceeded")]
    assert [request.get("tool_choice") for request in requests] == [None, "none"]
    assert result.turns == 2
    assert result.text is not None
    assert not result.state.pending
    # The reply is the answer if it holds the result; else (the model miscounting the sum
    # it was given) the episode halts with the result's gist.
    if isinstance(events[-1], AnsweredAfterStop):
        assert events[-1] == AnsweredAfterStop(guard="max_turns", reason="max_turns_exceeded")
        assert (result.terminal, result.stop_reason) == ("end_turn", "end_turn")
    else:
        assert events[-1] == Halted(
            guard="max_turns", reason="max_turns_exceeded", message=asked[0].message
        )
        assert result.terminal == "terminated"
    assert "42" in result.text
