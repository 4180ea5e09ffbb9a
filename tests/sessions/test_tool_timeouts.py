"""Per-tool timeouts: `ToolSpec(timeout=...)` bounds that tool's calls, else the run's or
host's `tool_timeout` does; a call past its timeout is a tool error naming the timeout,
and the session goes on. A timeout that is no number of seconds is refused up front."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from turnkeeper.core import AgentSpec, InputError, ToolSpec
from turnkeeper.events import ToolReturned
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

# The tools that never answer: only a timeout ends their calls.
HANGS = ToolSpec("hangs", "Never answers", timeout=0.05)
STALLS = ToolSpec("stalls", "Never answers either")
QUICK = ToolSpec("quick", "Answers at once", timeout=0.05)
SPEC = AgentSpec(system_prompt="Use the tools.", tools=(HANGS, STALLS, QUICK))


async def never(**_: Any) -> str:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def quick(**_: Any) -> str:
    return "quick answer"


TOOLS = {"hangs": never, "stalls": never, "quick": quick}


def script() -> ScriptedChat:
    return ScriptedChat(
        [
            tool_response(("hangs", {}, "h"), ("stalls", {}, "s"), ("quick", {}, "q")),
            text_response("Two tools timed out."),
        ]
    )


def errors_sent(chat: ScriptedChat) -> dict[str, Any]:
    """What the second request told the model of each call, by call id."""
    sent: dict[str, Any] = {}
    for message in chat.requests[1]["messages"]:
        if message["role"] == "tool":
            content = message["content"]
            sent[message["tool_call_id"]] = (
                json.loads(content) if content.startswith("{") else content
            )
    return sent


async def test_a_tools_own_timeout_wins_over_the_runs() -> None:
    chat = script()
    result = await run(SPEC, "go", chat, tools=TOOLS, tool_timeout=0.2)
    assert result.text == "Two tools timed out."
    sent = errors_sent(chat)
    assert sent["h"] == {"error": "hangs timed out after 0.05 s", "isError": True}
    assert sent["s"] == {"error": "stalls timed out after 0.2 s", "isError": True}
    assert sent["q"] == "quick answer"
    assert replay(result.events) == result.state


async def test_a_tools_own_timeout_wins_over_the_hosts() -> None:
    chat = script()
    async with Host(chat=chat, tools=TOOLS, tool_timeout=0.2) as host:
        session_id = await host.start(SPEC, "go")
        info = await host.result(session_id, wait=30)
        events = await host.events(session_id)
    assert info.text == "Two tools timed out."
    returned = {e.event.tool_call_id: e.event for e in events if isinstance(e.event, ToolReturned)}
    assert returned["h"] == ToolReturned("h", "hangs timed out after 0.05 s", is_error=True)
    assert returned["s"] == ToolReturned("s", "stalls timed out after 0.2 s", is_error=True)
    assert returned["q"] == ToolReturned("q", "quick answer")


async def test_a_tools_timeout_applies_with_none_for_the_run() -> None:
    chat = ScriptedChat([tool_response(("hangs", {}, "h")), text_response("It timed out.")])
    result = await run(SPEC, "go", chat, tools=TOOLS)
    assert result.text == "It timed out."
    assert errors_sent(chat)["h"]["error"] == "hangs timed out after 0.05 s"


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), "1", True])
async def test_a_timeout_that_is_no_number_of_seconds_is_refused(timeout: Any) -> None:
    spec = AgentSpec(tools=(ToolSpec("t", timeout=timeout),))
    with pytest.raises(
        InputError, match=r"spec.tools\[0\].timeout: expected None or a number of seconds"
    ):
        await run(spec, "go", ScriptedChat([]))
    async with Host(chat=ScriptedChat([])) as host:
        with pytest.raises(InputError, match=r"spec.tools\[0\].timeout"):
            await host.start(spec, "go")
