"""Tools: argument validation, in-process handlers, MCP servers, and the example tools."""

from turnkeeper.core import coerce, validate
from turnkeeper.tools._examples import EXAMPLE_TOOLS
from turnkeeper.tools._handlers import (
    MAX_TOOL_RESULT_CHARS,
    ToolContext,
    ToolFunctions,
    ToolHandler,
    Tools,
    as_handler,
    check_call,
    coerce_call,
    cut_result,
    handled_as_error,
    run_each,
    run_tool,
)
from turnkeeper.tools._mcp import McpError, McpPool, McpTools, mcp_servers_from_commands

__all__ = [
    "EXAMPLE_TOOLS",
    "MAX_TOOL_RESULT_CHARS",
    "McpError",
    "McpPool",
    "McpTools",
    "ToolContext",
    "ToolFunctions",
    "ToolHandler",
    "Tools",
    "as_handler",
    "check_call",
    "coerce",
    "coerce_call",
    "cut_result",
    "handled_as_error",
    "mcp_servers_from_commands",
    "run_each",
    "run_tool",
    "validate",
]
