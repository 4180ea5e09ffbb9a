"""Tools: reading tool calls from text replies, argument validation, and in-process handlers."""

from turnkeeper._jsonschema import coerce, validate
from turnkeeper.tools._examples import EXAMPLE_TOOLS
from turnkeeper.tools._handlers import (
    ToolContext,
    ToolFunctions,
    ToolHandler,
    Tools,
    as_handler,
    check_call,
    coerce_call,
    run_tool,
)
from turnkeeper.tools._parse import ParsedCall, ParsedReply, parse_tool_calls
from turnkeeper.tools._ranking import SCHEMA_BUDGET, compact_schema, rank_tools

__all__ = [
    "EXAMPLE_TOOLS",
    "SCHEMA_BUDGET",
    "ParsedCall",
    "ParsedReply",
    "ToolContext",
    "ToolFunctions",
    "ToolHandler",
    "Tools",
    "as_handler",
    "check_call",
    "coerce",
    "coerce_call",
    "compact_schema",
    "parse_tool_calls",
    "rank_tools",
    "run_tool",
    "validate",
]
