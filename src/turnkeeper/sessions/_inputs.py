"""The inputs that advance a session by one poll."""

from __future__ import annotations

import msgspec

from turnkeeper.core import ToolResult, ToolUse


class Kickoff(msgspec.Struct, frozen=True):
    """The first request of a session."""

    prompt: str


class UserMessage(msgspec.Struct, frozen=True):
    """A follow-up request; like Kickoff, it starts a new request episode."""

    text: str


class Resume(msgspec.Struct, frozen=True):
    """The results of the pending tool uses (none, when every call was self-answered)."""

    tool_uses: tuple[ToolUse, ...] = ()
    results: tuple[ToolResult, ...] = ()


Input = Kickoff | UserMessage | Resume
