"""Chat backends and what wraps them: the chat type, retry, and a scripted backend for tests."""

from turnkeeper.core import Chat
from turnkeeper.providers._chat import error_for_status, parse_retry_after
from turnkeeper.providers._embedded import EmbeddedChat, EmbeddedUnavailable, default_model_path
from turnkeeper.providers._inline import InlineTools
from turnkeeper.providers._openai import OpenAIChat, aclose_shared_client
from turnkeeper.providers._parse import ParsedCall, ParsedReply, parse_tool_calls
from turnkeeper.providers._ranking import SCHEMA_BUDGET, compact_schema, rank_tools
from turnkeeper.providers._report import collecting_events, report_event
from turnkeeper.providers._retry import with_retry
from turnkeeper.providers._scripted import (
    ScriptedChat,
    ScriptExhausted,
    ScriptItem,
    ToolCallSpec,
    text_response,
    tool_response,
)
from turnkeeper.providers._shaping import (
    TokenCounter,
    approx_tokens,
    step_timeout_error,
    with_prompt_fitting,
    with_step_timeout,
    with_tool_ranking,
)
from turnkeeper.providers._stream import DeltaSink, delta_sink, streaming_to

__all__ = [
    "SCHEMA_BUDGET",
    "Chat",
    "DeltaSink",
    "EmbeddedChat",
    "EmbeddedUnavailable",
    "InlineTools",
    "OpenAIChat",
    "ParsedCall",
    "ParsedReply",
    "ScriptExhausted",
    "ScriptItem",
    "ScriptedChat",
    "TokenCounter",
    "ToolCallSpec",
    "aclose_shared_client",
    "approx_tokens",
    "collecting_events",
    "compact_schema",
    "default_model_path",
    "delta_sink",
    "error_for_status",
    "parse_retry_after",
    "parse_tool_calls",
    "rank_tools",
    "report_event",
    "step_timeout_error",
    "streaming_to",
    "text_response",
    "tool_response",
    "with_prompt_fitting",
    "with_retry",
    "with_step_timeout",
    "with_tool_ranking",
]
