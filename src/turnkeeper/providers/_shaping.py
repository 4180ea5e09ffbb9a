"""Chat wrappers that shape each request before the backend sees it, or bound its time.

They change only what is sent: the session's history and log keep everything. Stack them
around a backend, outermost first, e.g.
`with_step_timeout(with_tool_ranking(with_prompt_fitting(backend, ...)), 60)`, and put
`with_retry` outside a step timeout so a timed-out attempt is retried.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import anyio

from turnkeeper.core import (
    Chat,
    ChatError,
    InputError,
    Message,
    ToolSpec,
    approx_tokens,
    text_of,
    wraps_chat,
)
from turnkeeper.providers._ranking import compact_schema, rank_tools

__all__ = [
    "TokenCounter",
    "approx_tokens",
    "with_prompt_fitting",
    "with_step_timeout",
    "with_tool_ranking",
]

TokenCounter: TypeAlias = Callable[[list[Message], list[dict[str, Any]]], int]
"""`count_tokens(messages, tools) -> int`: the prompt's size in the backend's tokens."""

_FEWER_TOOLS = (4, 2, 1)
_SYSTEM_ROLES = ("system", "developer")


def with_tool_ranking(chat: Chat, *, max_tools: int = 8) -> Chat:
    """`chat`, sent at most `max_tools` of the request's tools, with compact schemas.

    The tools are ranked by `rank_tools` against the last user message, with a bonus for
    the tools the history called most recently; a function the request's `tool_choice`
    names is always among them. Their `parameters` go through `compact_schema`.
    Everything else in the request is sent as it is.
    """
    if isinstance(max_tools, bool) or not isinstance(max_tools, int) or max_tools < 1:
        raise InputError(f"with_tool_ranking: max_tools must be an int >= 1, got {max_tools!r}")

    async def ranked(request: dict[str, Any]) -> dict[str, Any]:
        tools = request.get("tools")
        if not tools:
            return await chat(request)
        chosen = _ranked(tools, request.get("messages") or [], max_tools, _named(request))
        return await chat({**request, "tools": [_compacted(tool) for tool in chosen]})

    return wraps_chat(ranked, chat)


def with_prompt_fitting(
    chat: Chat,
    *,
    context_window: int,
    count_tokens: TokenCounter,
    reply_tokens: int = 256,
) -> Chat:
    """`chat`, sent a request that fits `context_window` tokens as `count_tokens` counts.

    The reply keeps the request's `max_tokens`, else `reply_tokens`, of the window. A
    request too long is cut in steps until it fits: its tools to the best 4, 2, then 1
    (ranked as `with_tool_ranking` does, so a function `tool_choice` names stays); then
    the oldest turns, dropped one at a time, so what is left starts on a user turn. The
    system message and the newest user turn always stay, and an assistant's tool calls go
    only together with their tool messages. Still too long: a permanent
    `ChatError("prompt too long: ...")`, which the session logs as a `local.chat_error`.
    """
    for name, value in (("context_window", context_window), ("reply_tokens", reply_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"with_prompt_fitting: {name} must be an int >= 0, got {value!r}")
    if not callable(count_tokens):
        raise InputError(
            f"with_prompt_fitting: count_tokens must be callable, got {count_tokens!r}"
        )

    async def fitted(request: dict[str, Any]) -> dict[str, Any]:
        reserved = request.get("max_tokens")
        if isinstance(reserved, bool) or not isinstance(reserved, int) or reserved < 0:
            reserved = reply_tokens
        budget = context_window - reserved
        messages: list[Message] = list(request.get("messages") or [])
        tools: list[dict[str, Any]] = list(request.get("tools") or [])
        tried = count_tokens(messages, tools)
        if tried <= budget:
            return await chat(request)
        for count in (n for n in _FEWER_TOOLS if n < len(tools)):
            tools = _ranked(tools, messages, count, _named(request))
            tried = count_tokens(messages, tools)
            if tried <= budget:
                return await chat({**request, "tools": tools})
        kept, tried = _drop_oldest_turns(messages, tools, budget, count_tokens)
        if kept is None:
            raise ChatError(
                f"prompt too long: {tried} tokens for a {context_window} token window "
                f"({reserved} of it kept for the reply)",
                transient=False,
            )
        shaped = {**request, "messages": kept}
        if "tools" in request:
            shaped["tools"] = tools
        return await chat(shaped)

    return wraps_chat(fitted, chat)


def with_step_timeout(chat: Chat, seconds: float) -> Chat:
    """`chat`, cancelled after `seconds`: a transient `ChatError("the model took longer than
    N s")` then. Cancelling the caller cancels the generation as well (anyio cancellation),
    so a backend must make its generation cancellable (an in-process model: stop it at its
    next token)."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise InputError(f"with_step_timeout: seconds must be a finite number > 0, got {seconds!r}")

    async def timed(request: dict[str, Any]) -> dict[str, Any]:
        with anyio.move_on_after(seconds):
            return await chat(request)
        raise step_timeout_error(seconds)

    return wraps_chat(timed, chat)


def step_timeout_error(seconds: float) -> ChatError:
    """The transient ChatError of a model call that took longer than `seconds`."""
    return ChatError(f"the model took longer than {seconds:g} s", transient=True)


def _ranked(
    tools: Sequence[dict[str, Any]],
    messages: Sequence[Message],
    max_tools: int,
    keep: str | None = None,
) -> list[dict[str, Any]]:
    """The request's `max_tools` best tools against its last user message, in their order;
    the tool named `keep`, if there is one, is always among them."""
    specs = [_spec(index, tool) for index, tool in enumerate(tools)]
    query, recent = _query(messages), _recent(messages)
    chosen = rank_tools(specs, query, max_tools=max_tools, recent=recent)
    kept = next((spec for spec in specs if spec.name == keep), None)
    if kept is not None and all(spec is not kept for spec in chosen):
        others = [spec for spec in specs if spec is not kept]
        rest = (
            rank_tools(others, query, max_tools=max_tools - 1, recent=recent)
            if max_tools > 1
            else []
        )
        chosen = [*rest, kept]
    position = {id(spec): index for index, spec in enumerate(specs)}
    return [tools[index] for index in sorted(position[id(spec)] for spec in chosen)]


def _named(request: dict[str, Any]) -> str | None:
    """The function the request's `tool_choice` names, if it names one."""
    choice = request.get("tool_choice")
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _spec(index: int, tool: object) -> ToolSpec:
    """A request's OpenAI-shaped tool as a ToolSpec to rank."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        raise ChatError(f"request tools[{index}]: expected a function tool", transient=False)
    description = function.get("description")
    parameters = function.get("parameters")
    try:
        return ToolSpec(
            function.get("name"),  # type: ignore[arg-type]  # ToolSpec checks it
            description if isinstance(description, str) else "",
            parameters if isinstance(parameters, dict) else {},
        )
    except InputError as error:
        raise ChatError(f"request tools[{index}]: {error}", transient=False) from None


def _compacted(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    parameters = function.get("parameters")
    if not isinstance(parameters, dict):
        return tool
    compact = compact_schema(parameters)
    if compact == parameters:
        return tool
    return {**tool, "function": {**function, "parameters": compact}}


def _query(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of(message) or ""
    return ""


def _recent(messages: Sequence[Message]) -> list[str]:
    """The tools the history called, most recent first."""
    names: list[str] = []
    for message in reversed(messages):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in reversed(calls) if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def _drop_oldest_turns(
    messages: list[Message],
    tools: list[dict[str, Any]],
    budget: int,
    count_tokens: TokenCounter,
) -> tuple[list[Message] | None, int]:
    """The messages with the fewest oldest turns dropped that fit `budget` (None when even
    dropping all that may go is not enough), and the token count of the shortest try."""
    blocks = _blocks(messages)
    users = [n for n, block in enumerate(blocks) if _role(messages[block[0]]) == "user"]
    newest_user = users[-1] if users else len(blocks)
    droppable = [
        n
        for n, block in enumerate(blocks)
        if n != newest_user and _role(messages[block[0]]) not in _SYSTEM_ROLES
    ]

    def kept_after(dropped: int) -> list[Message]:
        gone = set(droppable[:dropped])
        # What is left starts on a user turn: the turns that would lead it go too.
        for n in droppable[dropped:]:
            if n > newest_user or _role(messages[blocks[n][0]]) == "user":
                break
            gone.add(n)
        return [messages[i] for n, block in enumerate(blocks) if n not in gone for i in block]

    # Fewer turns never count more tokens, so search for the fewest drops that fit.
    low, high = 0, len(droppable)
    tried = count_tokens(kept_after(high), tools)
    if tried > budget:
        return None, tried
    while low < high:
        middle = (low + high) // 2
        if count_tokens(kept_after(middle), tools) <= budget:
            high = middle
        else:
            low = middle + 1
    return kept_after(high), tried


def _blocks(messages: Sequence[Message]) -> list[list[int]]:
    """Message indexes grouped into turns: an assistant message with tool calls together
    with the tool messages that answer it; any other message alone."""
    blocks: list[list[int]] = []
    for index, message in enumerate(messages):
        if _role(message) == "tool" and blocks and _calls(messages[blocks[-1][0]]):
            blocks[-1].append(index)
        else:
            blocks.append([index])
    return blocks


def _calls(message: Message) -> bool:
    return _role(message) == "assistant" and bool(message.get("tool_calls"))


def _role(message: object) -> object:
    return message.get("role") if isinstance(message, dict) else None
