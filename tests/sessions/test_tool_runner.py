"""The tool runner: a step's calls run (or refused) in call order, through the caller's hooks."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from turnkeeper.core import AgentSpec, ToolResult, ToolSpec, ToolUse
from turnkeeper.events import McpFailed
from turnkeeper.sessions._tool_runner import ToolRunner
from turnkeeper.tools import ToolContext

SPEC = AgentSpec(
    system_prompt="You help.",
    tools=(
        ToolSpec(
            "count", input_schema={"type": "object", "properties": {"n": {"type": "integer"}}}
        ),
        ToolSpec("boom"),
    ),
    model="tiny",
)


class Recording:
    """Hooks that record what the runner tells them, refusing calls of unknown tools."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def refusal(self, use: ToolUse) -> str | None:
        return None if SPEC.tool(use.name) is not None else f"unknown tool {use.name}"

    async def starting(self, use: ToolUse) -> ToolUse:
        self.seen.append(("starting", use.id))
        return ToolUse(use.id, use.name, {**use.input, "started": True})

    async def failed(self, failure: McpFailed) -> None:
        self.seen.append(("failed", failure.server))

    async def finished(self, use: ToolUse, result: ToolResult, *, ran: bool) -> None:
        self.seen.append(("ran" if ran else "refused", use.id))


@pytest.mark.anyio
async def test_calls_run_one_at_a_time_in_call_order_and_refused_ones_do_not_run() -> None:
    ran: list[tuple[str, dict[str, Any]]] = []

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        assert ctx.session_id == "s1"
        ran.append((ctx.tool_call_id, args))
        await anyio.lowlevel.checkpoint()
        if name == "boom":
            raise RuntimeError("it broke")
        return f"counted {args['n']}"

    uses = [
        ToolUse("a", "count", {"n": 1}),
        ToolUse("b", "nope", {}),
        ToolUse("c", "boom", {}),
        ToolUse("d", "count", {"n": 2}),
    ]
    hooks = Recording()
    runner = ToolRunner(handler, timeout=None, limit=1, max_chars=1_000)
    results = await runner.run(uses, hooks, session_id="s1", spec=SPEC, mcp=None)
    assert [result.tool_use_id for result in results] == ["a", "b", "c", "d"]
    assert results[0] == ToolResult("a", "counted 1")
    assert results[1] == ToolResult("b", "unknown tool nope", is_error=True)
    assert results[2].is_error
    assert "it broke" in results[2].text
    # The handler gets the call as `starting` gave it.
    assert ran == [
        ("a", {"n": 1, "started": True}),
        ("c", {"started": True}),
        ("d", {"n": 2, "started": True}),
    ]
    assert hooks.seen == [
        ("starting", "a"),
        ("ran", "a"),
        ("refused", "b"),
        ("starting", "c"),
        ("ran", "c"),
        ("starting", "d"),
        ("ran", "d"),
    ]


@pytest.mark.anyio
async def test_calls_run_together_up_to_the_limit_with_results_in_call_order() -> None:
    running = 0
    most = 0

    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        # Later calls finish first.
        await anyio.sleep(0.01 * (5 - args["n"]))
        running -= 1
        return str(args["n"])

    uses = [ToolUse(f"c{n}", "count", {"n": n}) for n in range(5)]
    runner = ToolRunner(handler, timeout=None, limit=2, max_chars=1_000)
    results = await runner.run(uses, Recording(), session_id="s1", spec=SPEC, mcp=None)
    assert [result.text for result in results] == ["0", "1", "2", "3", "4"]
    assert most == 2


@pytest.mark.anyio
async def test_a_result_longer_than_max_chars_is_cut_with_a_note() -> None:
    async def handler(name: str, args: dict[str, Any], ctx: ToolContext) -> str:
        return "x" * int(args["n"])

    uses = [ToolUse("short", "count", {"n": 10}), ToolUse("long", "count", {"n": 25})]
    runner = ToolRunner(handler, timeout=None, limit=8, max_chars=10)
    short, long = await runner.run(uses, Recording(), session_id="s1", spec=SPEC, mcp=None)
    assert short.text == "x" * 10
    assert long.text.startswith("x" * 10 + "\n[turnkeeper: result cut: 15 of its 25 characters")
