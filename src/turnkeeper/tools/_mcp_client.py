"""One live connection to an MCP server, held open by a task of the pool, through the
official `mcp` SDK. Imported only when a spec names MCP servers."""

from __future__ import annotations

import functools
import io
import math
import os
import re
import sys
from contextlib import AsyncExitStack
from typing import Any, TextIO

import anyio
import httpx2
import mcp_types
import msgspec
from anyio.abc import TaskStatus
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from turnkeeper.core import McpServer

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MAX_PAGES = 100  # of a tool listing, so a server that paginates forever cannot hang a start

_json = msgspec.json.Encoder()


class ListedTool(msgspec.Struct, frozen=True):
    """A tool as the server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]


class CallOutcome(msgspec.Struct, frozen=True):
    """How a call went: `failure` is None for an answer (an error one when `is_error`), else
    why there was none (`timeout`, `died` or `error`), with `text` saying it."""

    text: str
    is_error: bool = False
    failure: str | None = None


class Connection:
    """A client session with one server. `serve` runs in a pool task: it connects, lists the
    tools, reports, then holds the session open until `stop` or until the server goes."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.tools: tuple[ListedTool, ...] = ()
        self.alive = False
        self._client: Client | None = None
        self._stop = anyio.Event()

    async def serve(self, *, task_status: TaskStatus[str | None]) -> None:
        """Connect and list the tools; report None, or why the server could not start."""
        started = False
        # One scope around the whole connection, whose start-up deadline is lifted once
        # the tools are listed: the client's own scopes must nest inside it.
        with anyio.CancelScope(deadline=anyio.current_time() + self.server.timeout) as scope:
            try:
                async with AsyncExitStack() as stack:
                    client = await stack.enter_async_context(await _client(self.server, stack))
                    self.tools = await _list_tools(client)
                    scope.deadline = math.inf
                    self._client = client
                    self.alive = True
                    task_status.started(None)
                    started = True
                    await self._stop.wait()
            except Exception as exc:
                if not started:
                    task_status.started(_start_error(exc, self.server.timeout))
            finally:
                self.alive = False
                self._client = None
        if scope.cancelled_caught and not started:
            task_status.started(_start_error(TimeoutError(), self.server.timeout))

    def stop(self) -> None:
        """Close the session (the server process is stopped as the SDK's shutdown says)."""
        self.alive = False
        self._stop.set()

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> CallOutcome:
        """Call tool `name`; never raises for what the server or the transport does."""
        client = self._client
        if client is None or not self.alive:
            return CallOutcome("the connection is closed", failure="died")
        try:
            result = await client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except MCPError as exc:
            if exc.code == mcp_types.REQUEST_TIMEOUT:
                return CallOutcome(f"no answer within {timeout:g} s", failure="timeout")
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self.stop()
                return CallOutcome("the connection closed", failure="died")
            return CallOutcome(f"error {exc.code}: {exc}", failure="error")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            self.stop()
            return CallOutcome(f"the connection broke ({type(exc).__name__})", failure="died")
        except Exception as exc:
            return CallOutcome(f"{type(exc).__name__}: {exc}", failure="error")
        return CallOutcome(_result_text(result), is_error=bool(result.is_error))


async def _client(server: McpServer, stack: AsyncExitStack) -> Client:
    """An unentered SDK client for `server`; an HTTP client it needs is closed by `stack`."""
    if server.command is not None:
        params = StdioServerParameters(
            command=server.command, args=list(server.args), env=_expand(server.env, "env")
        )
        return Client(stdio_client(params, errlog=_errlog()), read_timeout_seconds=server.timeout)
    assert server.url is not None
    http = await stack.enter_async_context(
        httpx2.AsyncClient(
            headers=_expand(server.headers, "headers"),
            # The SDK's defaults: a server may hold a response stream open for long.
            timeout=httpx2.Timeout(30.0, read=300.0),
        )
    )
    transport = streamable_http_client(server.url, http_client=http)
    return Client(transport, read_timeout_seconds=server.timeout)


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: this process's stderr, or the one it started with
    when that has been replaced by a stream with no file (a StringIO, say), which a child
    process cannot write to. The SDK's default is the stderr of when it was imported."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (OSError, ValueError, io.UnsupportedOperation):
            continue
    return _devnull()


@functools.cache
def _devnull() -> TextIO:
    """One null stream for every server, opened once: servers hold their errlog for life."""
    return open(os.devnull, "w")


def _expand(values: dict[str, str], field: str) -> dict[str, str]:
    """`values` with each `${NAME}` replaced by that variable of this process's environment."""

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        value = os.environ.get(name)
        if value is None:
            raise LookupError(f"{field} names ${{{name}}}, but {name} is not set")
        return value

    return {key: _VARIABLE.sub(value_of, value) for key, value in values.items()}


async def _list_tools(client: Client) -> tuple[ListedTool, ...]:
    tools: list[ListedTool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(
            ListedTool(tool.name, tool.description or "", dict(tool.input_schema))
            for tool in page.tools
        )
        cursor = page.next_cursor
        if cursor is None:
            break
    return tuple(tools)


def _start_error(exc: BaseException, timeout: float) -> str:
    """Why a server could not start, in a sentence."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return f"it did not start and list its tools within {timeout:g} s"
    if isinstance(exc, LookupError):
        return str(exc)
    if isinstance(exc, MCPError) and exc.code == mcp_types.CONNECTION_CLOSED:
        return "it exited (or closed the connection) before it answered"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _result_text(result: mcp_types.CallToolResult) -> str:
    """A tool result's content as text for the model: text blocks as they are, other
    content described, structured content as JSON when there is no text."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data)} base64 characters]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[resource: {resource.uri}, {len(resource.blob)} base64 characters]")
    if not parts and result.structured_content is not None:
        try:
            return _json.encode(result.structured_content).decode()
        except (TypeError, msgspec.EncodeError):
            return repr(result.structured_content)
    return "\n".join(parts)
