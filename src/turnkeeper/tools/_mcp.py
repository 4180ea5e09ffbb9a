"""Tools served by MCP servers: a pool of connections shared by a process's sessions, and
each session's view of them (its spec with the listed tools, and the calls).

A session lists the tools of its spec's servers when it opens; they join the spec's tools
(with `mcp_server` set), so the logged spec holds them and replay needs no server. A
server that cannot start, dies, does not answer in time or answers with an error gives
the model an error result for that call and logs a `local.mcp_error`; the session goes on.
A dead server is started again on its next call. Tool names are the servers' own, after
the server's `tool_prefix`; a name that two servers, or a server and the spec, both give
is an McpError when the session opens (set a `tool_prefix` on one of them).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import msgspec
from anyio.abc import TaskGroup

from turnkeeper.core import (
    AgentSpec,
    InputError,
    McpServer,
    ToolResult,
    ToolSpec,
    ToolUse,
    check_tool,
)
from turnkeeper.events import McpFailed
from turnkeeper.tools._handlers import ToolContext, check_call

if TYPE_CHECKING:
    from turnkeeper.tools._mcp_client import Connection

_key_encoder = msgspec.json.Encoder(order="sorted")


class McpError(InputError):
    """MCP servers cannot be used as asked: their tool names collide, or the `mcp` extra
    is not installed."""


class McpPool:
    """Connections to MCP servers, one per distinct server spec, shared by every session
    that names it, and all closed when the pool's `async with` block ends. A Host holds
    one for its lifetime; `run` makes its own when it is not given one.

        async with McpPool() as pool:
            tools = await pool.open(spec)
    """

    def __init__(self) -> None:
        self._group: TaskGroup | None = None
        self._live: dict[bytes, Connection] = {}
        self._locks: dict[bytes, anyio.Lock] = {}

    async def __aenter__(self) -> McpPool:
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        group, self._group = self._group, None
        for connection in self._live.values():
            connection.stop()
        self._live.clear()
        assert group is not None
        if isinstance(exc, Exception):
            # The block's own error is not the connections' doing: let it through as it
            # is, not wrapped in the task group's exception group.
            await group.__aexit__(None, None, None)
            return None
        return await group.__aexit__(exc_type, exc, traceback)

    @property
    def connections(self) -> int:
        """How many servers are connected now."""
        return sum(connection.alive for connection in self._live.values())

    async def open(self, spec: AgentSpec) -> McpTools:
        """A session's view of its spec's MCP servers. Servers none of whose tools are in
        the spec yet are connected and their tools added; a server that fails to start
        adds none and is reported in `McpTools.events`. Raises McpError on a tool name
        that two servers, or a server and the spec, both give."""
        self._check_open()
        servers = [
            server
            for server in spec.mcp_servers
            if not any(tool.mcp_server == server.name for tool in spec.tools)
        ]
        outcomes: dict[str, Connection | str] = {}

        async def connect(server: McpServer) -> None:
            outcomes[server.name] = await self.connect(server)

        async with anyio.create_task_group() as group:
            for server in servers:
                group.start_soon(connect, server)
        added: list[ToolSpec] = []
        failures: list[McpFailed] = []
        for server in servers:
            outcome = outcomes[server.name]
            if isinstance(outcome, str):
                failures.append(McpFailed(server=server.name, reason="start_failed", error=outcome))
                continue
            for listed in outcome.tools:
                try:
                    tool = ToolSpec(
                        server.tool_prefix + listed.name,
                        listed.description,
                        listed.input_schema,
                        mcp_server=server.name,
                    )
                    # Left out here, rather than refusing the session as it opens.
                    check_tool(tool, "ToolSpec")
                    added.append(tool)
                except InputError as exc:
                    failures.append(
                        McpFailed(
                            server=server.name,
                            reason="error",
                            error=f"tool {listed.name!r} left out: {exc}",
                            tool=listed.name,
                        )
                    )
        _check_names(spec.tools, added)
        if added:
            spec = msgspec.structs.replace(spec, tools=(*spec.tools, *added))
        return McpTools(self, spec, tuple(failures))

    async def connect(self, server: McpServer) -> Connection | str:
        """The live connection to `server`, started if there is none: or why it could not
        start."""
        group = self._check_open()
        key = _key_encoder.encode(server)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            connection = self._live.get(key)
            if connection is not None and connection.alive:
                return connection
            from turnkeeper.tools._mcp_client import Connection

            connection = Connection(server)
            error: str | None = await group.start(connection.serve)
            if error is not None:
                return error
            self._live[key] = connection
            return connection

    def _check_open(self) -> TaskGroup:
        """The pool's task group; raises McpError when the pool is not open or the SDK
        is not installed."""
        if self._group is None:
            raise McpError("the MCP pool is not open: use it as `async with McpPool() as pool`")
        try:
            import turnkeeper.tools._mcp_client  # noqa: F401
        except ImportError as exc:
            raise McpError(
                "the mcp package is not installed; install turnkeeper with the mcp extra: "
                "pip install 'turnkeeper[mcp]'"
            ) from exc
        return self._group


class McpTools:
    """One session's MCP tools: `spec` is the session's spec with them added, `events` the
    `local.mcp_error`s of servers that could not start, to log after the session opens."""

    def __init__(self, pool: McpPool, spec: AgentSpec, events: tuple[McpFailed, ...]) -> None:
        self.pool = pool
        self.spec = spec
        self.events = events
        self._servers = {server.name: server for server in spec.mcp_servers}

    def serves(self, name: str) -> bool:
        """Whether tool `name` is called on an MCP server."""
        tool = self.spec.tool(name)
        return tool is not None and tool.mcp_server is not None

    def refusal(self, use: ToolUse) -> str | None:
        """Why `use` must not run (as `check_call`); an unknown tool's refusal also names
        the servers whose tools are missing because they could not start."""
        refusal = check_call(self.spec, use)
        if self.spec.tool(use.name) is not None:
            return refusal
        missing = [event for event in self.events if event.reason == "start_failed"]
        if not missing:
            return refusal
        if refusal is None:
            # A spec with no tools checks no call; here its tools were its servers', and
            # none started.
            refusal = f"Error: unknown tool {use.name!r}. There are no tools. Try again."
        notes = "; ".join(f"MCP server {e.server!r} could not start: {e.error}" for e in missing)
        return f"{refusal} Some tools are missing: {notes}."

    async def call(
        self, use: ToolUse, ctx: ToolContext, *, timeout: float | None = None
    ) -> tuple[ToolResult, McpFailed | None]:
        """Call `use` on its server, within the server's timeout (and `timeout`, if shorter).
        Returns the result for the model and, when the server failed, the event to log."""
        tool = self.spec.tool(use.name)
        if tool is None or tool.mcp_server is None:
            raise InputError(f"tool {use.name!r} is not served by an MCP server")
        server = self._servers[tool.mcp_server]
        limit = server.timeout if timeout is None else min(timeout, server.timeout)
        connection = await self.pool.connect(server)
        if isinstance(connection, str):
            text = f"{use.name} is unavailable: MCP server {server.name!r} could not start: "
            return self._failed(use, server, "start_failed", connection, text + connection)
        outcome = await connection.call(use.name.removeprefix(server.tool_prefix), use.input, limit)
        if outcome.failure is None:
            return ToolResult(use.id, outcome.text, is_error=outcome.is_error), None
        text = {
            "timeout": f"{use.name} timed out: MCP server {server.name!r} gave "
            f"{outcome.text}. Try again later or do without it.",
            "died": f"{use.name} failed: MCP server {server.name!r} stopped while running it "
            f"({outcome.text}); the call may or may not have taken effect.",
        }.get(outcome.failure, f"{use.name} failed: MCP server {server.name!r}: {outcome.text}")
        return self._failed(use, server, outcome.failure, outcome.text, text)

    @staticmethod
    def _failed(
        use: ToolUse, server: McpServer, reason: str, error: str, text: str
    ) -> tuple[ToolResult, McpFailed]:
        event = McpFailed(
            server=server.name, reason=reason, error=error, tool=use.name, tool_call_id=use.id
        )
        return ToolResult(use.id, text, is_error=True), event


def _check_names(tools: Sequence[ToolSpec], added: Sequence[ToolSpec]) -> None:
    """Raise McpError when an added tool's name is already taken."""
    owners: dict[str, str] = {tool.name: _owner(tool) for tool in tools}
    for tool in added:
        other = owners.get(tool.name)
        if other is not None:
            raise McpError(
                f"tool name {tool.name!r} is given by both {other} and {_owner(tool)}; "
                "set a tool_prefix on the MCP server to tell them apart"
            )
        owners[tool.name] = _owner(tool)


def _owner(tool: ToolSpec) -> str:
    return "the spec" if tool.mcp_server is None else f"MCP server {tool.mcp_server!r}"


def mcp_servers_from_commands(commands: Sequence[str]) -> tuple[McpServer, ...]:
    """Stdio MCP servers from command lines such as `'python server.py --root .'` (split as
    a POSIX shell would), named `mcp1`, `mcp2`, ... in order; for `turnkeeper run --mcp`."""
    servers: list[McpServer] = []
    for index, command in enumerate(commands, start=1):
        try:
            words = shlex.split(command)
        except ValueError as exc:
            raise InputError(f"--mcp {command!r}: {exc}") from None
        if not words:
            raise InputError("--mcp: give the server's command line")
        servers.append(McpServer(f"mcp{index}", command=words[0], args=tuple(words[1:])))
    return tuple(servers)
