"""Serial tools keep the reply's call order, on both anyio backends (trio starts the tasks
of a task group in no set order): with `tool_concurrency=1` the calls of one reply run one
after another in the order the model made them, in `run()` and in a Host; under a limit
below the number of calls they start in call order; results go back in call order
whatever the limit."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, ToolSpec
from turnkeeper.events import ToolCalled
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, run
from turnkeeper.tools import ToolContext

STEP = ToolSpec("step", "One step", {"type": "object", "properties": {"n": {"type": "integer"}}})
SPEC = AgentSpec(system_prompt="Take the steps.", tools=(STEP,))
BACKENDS = ["asyncio", "trio"]

# The checkpoints each call waits through before it returns: a call that waits longer
# than the next one would finish after it, were they run together.
waits = st.lists(st.integers(0, 4), min_size=1, max_size=8)


class Steps:
    """The `step` handler, noting when each call starts and ends."""

    def __init__(self, waits: list[int]) -> None:
        self.waits = waits
        self.seen: list[tuple[str, int]] = []

    async def __call__(self, name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        n = args["n"]
        self.seen.append(("start", n))
        for _ in range(self.waits[n]):
            await anyio.lowlevel.checkpoint()
        self.seen.append(("end", n))
        return f"step {n} done"

    def starts(self) -> list[int]:
        return [n for kind, n in self.seen if kind == "start"]


def reply(count: int) -> dict[str, Any]:
    return tool_response(*(("step", {"n": n}, f"call_{n}") for n in range(count)))


def one_after_another(count: int) -> list[tuple[str, int]]:
    return [event for n in range(count) for event in (("start", n), ("end", n))]


def tool_texts(chat: ScriptedChat) -> list[str]:
    return [m["content"] for m in chat.requests[1]["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40)
@given(waits=waits)
def test_run_with_serial_tools_keeps_the_call_order(backend: str, waits: list[int]) -> None:
    steps = Steps(waits)
    chat = ScriptedChat([reply(len(waits)), text_response("done")])

    async def main() -> None:
        result = await run(SPEC, "go", chat, tools=steps, tool_concurrency=1)
        assert result.text == "done"

    anyio.run(main, backend=backend)
    assert steps.seen == one_after_another(len(waits))
    assert tool_texts(chat) == [f"step {n} done" for n in range(len(waits))]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40)
@given(waits=waits)
def test_a_host_with_serial_tools_keeps_the_call_order(backend: str, waits: list[int]) -> None:
    steps = Steps(waits)
    chat = ScriptedChat([reply(len(waits)), text_response("done")])

    async def main() -> None:
        async with Host(chat=chat, tools=steps, tool_concurrency=1) as host:
            session_id = await host.start(SPEC, "go")
            assert (await host.result(session_id, wait=30)).text == "done"
            events = await host.events(session_id)
        called = [e.event.tool_call_id for e in events if isinstance(e.event, ToolCalled)]
        assert called == [f"call_{n}" for n in range(len(waits))]

    anyio.run(main, backend=backend)
    assert steps.seen == one_after_another(len(waits))
    assert tool_texts(chat) == [f"step {n} done" for n in range(len(waits))]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40)
@given(waits=waits, limit=st.integers(1, 9))
def test_calls_start_in_call_order_under_a_limit(
    backend: str, waits: list[int], limit: int
) -> None:
    steps = Steps(waits)
    chat = ScriptedChat([reply(len(waits)), text_response("done")])

    async def main() -> None:
        await run(SPEC, "go", chat, tools=steps, tool_concurrency=limit)

    anyio.run(main, backend=backend)
    if limit < len(waits):
        assert steps.starts() == list(range(len(waits)))
    else:
        assert sorted(steps.starts()) == list(range(len(waits)))
    # At most `limit` at once.
    running = 0
    for kind, _ in steps.seen:
        running += 1 if kind == "start" else -1
        assert running <= limit
    assert tool_texts(chat) == [f"step {n} done" for n in range(len(waits))]
