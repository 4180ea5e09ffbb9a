"""The chat contract's type: an async callable from a request to a response; and what a
backend may say of itself besides, with the defaults when it says nothing."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import msgspec

from turnkeeper.core._errors import ChatError

Chat: TypeAlias = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""A chat backend: `async def chat(request) -> response`, both OpenAI chat-completions shaped.

On failure it raises `ChatError`, with `transient=True` when the same request may succeed later.

A backend may also have `async def estimate_tokens(messages) -> int`, its count of the
tokens of a history's messages, and `context_window: int`, the tokens of prompt and reply
it holds (`estimate_tokens` and `context_window` below read them, with their defaults).
Wrappers keep them with `wraps_chat`.
"""

_CAPABILITIES = ("estimate_tokens", "context_window")
_encode = msgspec.json.Encoder().encode


def approx_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """A rough token count for a backend without a tokenizer: UTF-8 bytes of the messages'
    and tools' JSON, divided by 4 and rounded up (English text runs about 4 characters a
    token; other scripts take more bytes per token, so they are over-counted, not under)."""
    return math.ceil(len(_encode([messages, tools])) / 4)


async def estimate_tokens(chat: Chat, messages: Sequence[dict[str, Any]]) -> int:
    """The tokens of `messages` as `chat` estimates them (its `estimate_tokens`), else, or
    when its estimate fails or is no count, as `approx_tokens` does."""
    own = getattr(chat, "estimate_tokens", None)
    listed = list(messages)
    if callable(own):
        try:
            count = await own(listed)
        except ChatError:
            count = None
        if type(count) is int and count >= 0:
            return count
    return approx_tokens(listed, [])


def context_window(chat: Chat) -> int | None:
    """The tokens of prompt and reply `chat` holds, if it declares them (its
    `context_window`, an integer of 1 or more); None if it does not."""
    window = getattr(chat, "context_window", None)
    if type(window) is int and window >= 1:
        return window
    return None


def wraps_chat(wrapper: Chat, chat: Chat) -> Chat:
    """`wrapper`, a backend that calls `chat`, given what `chat` says of itself
    (`estimate_tokens`, `context_window`), so that wrapping it loses neither."""
    for name in _CAPABILITIES:
        value = getattr(chat, name, None)
        if value is not None:
            setattr(wrapper, name, value)
    return wrapper
