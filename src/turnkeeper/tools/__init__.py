"""Tools: reading tool calls from text replies, argument validation, and in-process handlers."""

from turnkeeper._jsonschema import validate
from turnkeeper.tools._examples import EXAMPLE_TOOLS
from turnkeeper.tools._handlers import (
    ToolContext,
    ToolFunctions,
    ToolHandler,
    Tools,
    as_handler,
    check_call,
    run_tool,
)
from turnkeeper.tools._parse import ParsedCall, ParsedReply, parse_tool_calls

__all__ = [
    "EXAMPLE_TOOLS",
    "ParsedCall",
    "ParsedReply",
    "ToolContext",
    "ToolFunctions",
    "ToolHandler",
    "Tools",
    "as_handler",
    "check_call",
    "parse_tool_calls",
    "run_tool",
    "validate",
]
