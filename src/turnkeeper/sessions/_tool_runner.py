"""The tool runner: runs one step's tool calls in-process or on MCP servers, for `run()` and
the Host alike. What each of them logs around a call (and when) is theirs, through the
hooks of `ToolCalls`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from turnkeeper.core import AgentSpec, ToolResult, ToolUse
from turnkeeper.events import McpFailed
from turnkeeper.tools import (
    McpTools,
    ToolContext,
    ToolHandler,
    Tools,
    as_handler,
    cut_result,
    run_each,
    run_tool,
)
from turnkeeper.tracing import tool_span


class ToolCalls(Protocol):
    """What a runner's caller does around each call of a step."""

    def refusal(self, use: ToolUse) -> str | None:
        """Why `use` must not run (it is answered by this error without running), or None."""
        ...

    async def starting(self, use: ToolUse) -> ToolUse:
        """`use` is about to run: the call as its handler gets it (coerced)."""
        ...

    async def failed(self, failure: McpFailed) -> None:
        """The MCP server of a call failed (the call's result is the error)."""
        ...

    async def finished(self, use: ToolUse, result: ToolResult, *, ran: bool) -> None:
        """The call has its result; `ran` is False for a refused call."""
        ...


class ToolRunner:
    """Runs calls with the handler of `tools` (or on their MCP server), at most `limit` at a
    time and started in call order, each within its tool's `timeout` seconds, else
    `timeout`; a result longer than `max_chars` (a handler's or an MCP server's) is cut,
    with a note saying so. InputError at once for `tools` that are no handler."""

    def __init__(
        self, tools: Tools | None, *, timeout: float | None, limit: int, max_chars: int
    ) -> None:
        self.handler: ToolHandler | None = as_handler(tools) if tools is not None else None
        # The tools the handler answers: those a mapping names; None when one handler takes
        # every call (or none). Found once: an ABC's isinstance check is slow.
        self.names = frozenset(tools) if isinstance(tools, Mapping) else None
        self.timeout = timeout
        self.limit = limit
        self.max_chars = max_chars

    def handles(self, name: str) -> bool:
        """Whether the handler answers calls of the tool `name`."""
        return self.handler is not None and (self.names is None or name in self.names)

    async def run(
        self,
        uses: Sequence[ToolUse],
        calls: ToolCalls,
        *,
        session_id: str,
        spec: AgentSpec,
        mcp: McpTools | None,
    ) -> list[ToolResult]:
        """Run the calls of session `session_id`; their results, in call order. Refused
        calls are answered without running."""
        results: dict[str, ToolResult] = {}
        handler = self.handler

        async def one(use: ToolUse) -> None:
            refusal = calls.refusal(use)
            if refusal is not None:
                result = results[use.id] = ToolResult(use.id, refusal, is_error=True)
                await calls.finished(use, result, ran=False)
                return
            use = await calls.starting(use)
            ctx = ToolContext(session_id, use.id, use.name)
            failure: McpFailed | None = None
            tool = spec.tool(use.name)
            timeout = self.timeout if tool is None or tool.timeout is None else tool.timeout
            with tool_span(use, tool) as span:
                if mcp is not None and mcp.serves(use.name):
                    result, failure = await mcp.call(use, ctx, timeout=timeout)
                    result = cut_result(result, self.max_chars)
                    if failure is not None:
                        await calls.failed(failure)
                else:
                    assert handler is not None
                    result = await run_tool(
                        handler, use, ctx, timeout=timeout, max_chars=self.max_chars
                    )
                span.result(result, failure)
            results[use.id] = result
            await calls.finished(use, result, ran=True)

        if len(uses) == 1:
            # The usual case, run here: a frame less for a session to hold while it waits.
            await one(uses[0])
        else:
            await run_each(one, uses, limit=self.limit)
        return [results[use.id] for use in uses]
