"""Chat backends and what wraps them: the chat type, retry, and a scripted backend for tests."""

from turnkeeper.providers._chat import Chat, error_for_status, parse_retry_after
from turnkeeper.providers._embedded import EmbeddedChat, EmbeddedUnavailable
from turnkeeper.providers._inline import InlineTools
from turnkeeper.providers._openai import OpenAIChat, aclose_shared_client
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
    with_prompt_fitting,
    with_step_timeout,
    with_tool_ranking,
)

__all__ = [
    "Chat",
    "EmbeddedChat",
    "EmbeddedUnavailable",
    "InlineTools",
    "OpenAIChat",
    "ScriptExhausted",
    "ScriptItem",
    "ScriptedChat",
    "TokenCounter",
    "ToolCallSpec",
    "aclose_shared_client",
    "approx_tokens",
    "error_for_status",
    "parse_retry_after",
    "text_response",
    "tool_response",
    "with_prompt_fitting",
    "with_retry",
    "with_step_timeout",
    "with_tool_ranking",
]
