"""An MCP server for the tests, written with the official SDK: `python mcp_server.py` serves
stdio; `python mcp_server.py --http PORT` serves streamable HTTP on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("turnkeeper-test", log_level="CRITICAL")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    return " ".join([text] * times)


@server.tool()
def fail(reason: str) -> str:
    """Always fail, with the given reason."""
    raise ToolError(f"refused: {reason}")


@server.tool()
async def hang() -> str:
    """Never answer."""
    await anyio.sleep_forever()
    return "unreachable"


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@server.tool()
def pid(note: str = "") -> int:
    """The server's process id, to tell whether two sessions share a server (`note` lets
    a test make calls that are not repeats)."""
    return os.getpid()


@server.tool()
def secret() -> str:
    """The TEST_SECRET variable of the server's environment."""
    return os.environ.get("TEST_SECRET", "<unset>")


@server.tool()
def header(name: str, ctx: Context) -> str:
    """A header of the HTTP request that carried this call."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return "<no request>" if headers is None else str(headers.get(name, "<missing>"))


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
