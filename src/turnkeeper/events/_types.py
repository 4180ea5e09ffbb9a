"""Data shared by every layer: usage, tool specs, the agent spec, tool uses and results."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from turnkeeper.events._errors import InputError

Message = dict[str, Any]
"""An OpenAI chat-completions message, string-keyed, kept verbatim."""

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class Usage(msgspec.Struct, frozen=True):
    """Token usage of one or more model calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


class ToolSpec(msgspec.Struct, frozen=True):
    """A tool the model may call. `repeatable` tools (a status poll, say) are never deduplicated."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    repeatable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOOL_NAME.match(self.name):
            raise InputError(
                f"ToolSpec.name: {self.name!r} must be 1 to 64 letters, digits, '_', '.' or '-'"
            )
        if not isinstance(self.input_schema, dict):
            raise InputError(f"ToolSpec.input_schema of {self.name!r} must be a JSON Schema object")

    def to_openai(self) -> dict[str, Any]:
        """The tool in OpenAI chat-completions shape."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema,
            },
        }


class AgentSpec(msgspec.Struct, frozen=True):
    """What an agent is: its system prompt, tools, terminal tool, model and sampling params."""

    system_prompt: str = ""
    tools: tuple[ToolSpec, ...] = ()
    terminal_tool: str | None = None
    model: str = "default"
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        tools = tuple(self.tools)
        msgspec.structs.force_setattr(self, "tools", tools)
        if self.stop is not None:
            msgspec.structs.force_setattr(self, "stop", tuple(self.stop))
        names = [tool.name for tool in tools]
        for name in names:
            if names.count(name) > 1:
                raise InputError(f"AgentSpec.tools: tool {name!r} is listed twice")
        if self.terminal_tool is not None and self.terminal_tool not in names:
            raise InputError(
                f"AgentSpec.terminal_tool: {self.terminal_tool!r} is not one of the tools "
                f"({', '.join(names) or 'none given'})"
            )

    def tool(self, name: str) -> ToolSpec | None:
        """The tool called `name`, if the spec has it."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None

    def sampling(self) -> dict[str, Any]:
        """The sampling params that are set, as request fields."""
        params: dict[str, Any] = {}
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.top_p is not None:
            params["top_p"] = self.top_p
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.seed is not None:
            params["seed"] = self.seed
        if self.stop is not None:
            params["stop"] = list(self.stop)
        return params


class ToolUse(msgspec.Struct, frozen=True):
    """A tool call the model made. `error` says why `input` is `{}` when the arguments were bad."""

    id: str
    name: str
    input: dict[str, Any]
    error: str | None = None


class ToolResult(msgspec.Struct, frozen=True):
    """The answer to one tool use."""

    tool_use_id: str
    text: str
    is_error: bool = False
