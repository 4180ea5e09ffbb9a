"""The chat contract's type: an async callable from a request to a response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

Chat: TypeAlias = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""A chat backend: `async def chat(request) -> response`, both OpenAI chat-completions shaped.

On failure it raises `ChatError`, with `transient=True` when the same request may succeed later.
"""
