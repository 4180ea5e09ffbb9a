"""Tools: reading tool calls from text replies, argument validation, ranking, handlers."""

from turnkeeper.tools._parse import ParsedCall, ParsedReply, parse_tool_calls

__all__ = [
    "ParsedCall",
    "ParsedReply",
    "parse_tool_calls",
]
