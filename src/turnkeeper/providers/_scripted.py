"""ScriptedChat: a chat backend that plays back a script, for testing agents without a model."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeAlias

import msgspec

from turnkeeper.core import InputError, TurnkeeperError, Usage, check_count

ScriptItem: TypeAlias = (
    dict[str, Any]
    | BaseException
    | Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]]]
)
"""One step of a script: a response, an exception to raise, or a function of the request."""

ToolCallSpec: TypeAlias = tuple[str, dict[str, Any] | str] | tuple[str, dict[str, Any] | str, str]
"""`(name, arguments)` or `(name, arguments, id)`; arguments as a dict or a raw JSON string."""

_SHOWN = 300  # characters of the unanswered message quoted in ScriptExhausted


class ScriptExhausted(TurnkeeperError):
    """A ScriptedChat was called after it had played back every response in its script."""

    def __init__(self, scripted: int, request: dict[str, Any]) -> None:
        plural = "" if scripted == 1 else "s"
        super().__init__(
            f"ScriptedChat ran out of responses: its script had {scripted} response{plural}, "
            f"all used, and the agent made another model call; {_describe_last_message(request)}"
        )
        self.scripted = scripted
        self.request = request


class _AutoIdCall(dict[str, Any]):
    """A tool call whose id `tool_response` chose; ScriptedChat renumbers it on playback."""


class ScriptedChat:
    """A chat backend that answers each call with the next item of a script, in order.

    Each item is one of:

    - a response dict (build one with `text_response` or `tool_response`), returned as is
      (but for the tool-call ids `tool_response` chose, see below);
    - an exception instance, raised (`ChatError("HTTP 503", transient=True)`, say);
    - a function of the request, sync or async, returning the response dict; it sees the
      same copy of the request that `requests` records, and may raise.

    `requests` holds a copy of every request received, in order (the dict and its
    top-level lists, such as `messages`), so a test can check exactly what the model
    was sent; `calls` counts them. A call after the last item raises `ScriptExhausted`.
    Tool calls built by `tool_response` without an id get `call_1`, `call_2`, ... in
    playback order, unique across the script, as a real API's ids are.
    `context_window` (tokens), if given, is declared as a backend's own is, so a session
    compacts its history by it as it would on a model with that window (see `Compaction`).

        chat = ScriptedChat([
            tool_response(("search", {"q": "turnkeeper"})),
            text_response("Found it."),
        ])
    """

    def __init__(
        self, responses: Iterable[ScriptItem], *, context_window: int | None = None
    ) -> None:
        if isinstance(responses, Mapping):
            raise InputError(
                "ScriptedChat: responses must be a list of responses, not one response dict; "
                "wrap it in a list: ScriptedChat([response])"
            )
        try:
            self._script: tuple[ScriptItem, ...] = tuple(responses)
        except TypeError:
            raise InputError(
                f"ScriptedChat: responses must be a list of responses, got {responses!r}"
            ) from None
        for index, item in enumerate(self._script):
            _check_item(index, item)
        if context_window is not None:
            check_count("ScriptedChat context_window", context_window, 1, optional=True)
        self.context_window = context_window
        self._next = 0
        self._last_call_id = 0
        self.requests: list[dict[str, Any]] = []

    @property
    def calls(self) -> int:
        """How many times this chat has been called, including calls that raised."""
        return len(self.requests)

    @property
    def remaining(self) -> int:
        """How many script items have not been played back yet."""
        return len(self._script) - self._next

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        """Record `request` and play back the next script item."""
        if not isinstance(request, dict):
            raise InputError(
                f"ScriptedChat: a request must be a dict, got {type(request).__name__}"
            )
        seen = {
            key: list(value) if isinstance(value, list) else value for key, value in request.items()
        }
        self.requests.append(seen)
        if self._next == len(self._script):
            raise ScriptExhausted(len(self._script), seen)
        index = self._next
        item = self._script[index]
        self._next += 1
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, dict):
            return self._assign_call_ids(item)
        result = item(seen)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, dict):
            raise InputError(
                f"ScriptedChat: script item {index} ({_name(item)}) returned "
                f"{type(result).__name__}; it must return a response dict"
            )
        return self._assign_call_ids(result)

    def _assign_call_ids(self, response: dict[str, Any]) -> dict[str, Any]:
        """`response`, copied with fresh ids where `tool_response` chose them."""
        choices = response.get("choices")
        if not isinstance(choices, list) or not any(_has_auto_ids(c) for c in choices):
            return response
        renumbered = [self._renumber(c) if _has_auto_ids(c) else c for c in choices]
        return {**response, "choices": renumbered}

    def _renumber(self, choice: dict[str, Any]) -> dict[str, Any]:
        message = choice["message"]
        calls = [self._with_fresh_id(call) for call in message["tool_calls"]]
        return {**choice, "message": {**message, "tool_calls": calls}}

    def _with_fresh_id(self, call: Any) -> Any:
        if not isinstance(call, _AutoIdCall):
            return call
        self._last_call_id += 1
        return {**call, "id": f"call_{self._last_call_id}"}


def _has_auto_ids(choice: object) -> bool:
    message = choice.get("message") if isinstance(choice, dict) else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return isinstance(calls, list) and any(isinstance(call, _AutoIdCall) for call in calls)


def text_response(
    text: str,
    *,
    finish_reason: str = "stop",
    usage: Usage | tuple[int, int] | None = None,
) -> dict[str, Any]:
    """A response in which the assistant replies with `text`.

    `usage` is `(prompt_tokens, completion_tokens)` or a `Usage`; without it the response
    has no `usage` field, as with some local servers.
    """
    if not isinstance(text, str):
        raise InputError(f"text_response: text must be a str, got {type(text).__name__}")
    if not isinstance(finish_reason, str):
        raise InputError(f"text_response: finish_reason must be a str, got {finish_reason!r}")
    message = {"role": "assistant", "content": text}
    return _response(message, finish_reason, usage, "text_response")


def tool_response(
    *calls: ToolCallSpec,
    content: str | None = None,
    usage: Usage | tuple[int, int] | None = None,
) -> dict[str, Any]:
    """A response in which the assistant calls tools, with finish_reason `tool_calls`.

    Each call is `(name, arguments)` or `(name, arguments, id)`. A dict of arguments is
    encoded as JSON; a str is sent verbatim, so a test can feed the agent broken JSON.
    Calls without an id get `call_1`, `call_2`, ... in this response, which a
    `ScriptedChat` renumbers as it plays them back so ids are unique across its script.
    `content` is text the assistant says alongside the calls; `usage` as in `text_response`.

        tool_response(("read_file", {"path": "a.txt"}), ("read_file", '{"path": "b'))
    """
    if not calls:
        raise InputError(
            "tool_response: give at least one (name, arguments) call; "
            "for a reply without tool calls use text_response"
        )
    if content is not None and not isinstance(content, str):
        raise InputError(f"tool_response: content must be a str or None, got {content!r}")
    tool_calls = [_tool_call(position, call) for position, call in enumerate(calls, start=1)]
    message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    return _response(message, "tool_calls", usage, "tool_response")


def _tool_call(position: int, call: object) -> dict[str, Any]:
    where = f"tool_response: call {position}"
    if not isinstance(call, tuple) or len(call) not in (2, 3):
        raise InputError(
            f"{where} must be (name, arguments) or (name, arguments, id), got {call!r}"
        )
    name, arguments = call[0], call[1]
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: the name must be a non-empty str, got {name!r}")
    if isinstance(arguments, dict):
        try:
            arguments = msgspec.json.encode(arguments).decode()
        except (TypeError, ValueError, msgspec.EncodeError) as error:
            raise InputError(
                f"{where} ({name}): arguments are not JSON-encodable: {error}"
            ) from None
    elif not isinstance(arguments, str):
        raise InputError(
            f"{where} ({name}): arguments must be a dict or a JSON str, "
            f"got {type(arguments).__name__}"
        )
    function = {"name": name, "arguments": arguments}
    if len(call) == 3:
        call_id = call[2]
        if not isinstance(call_id, str) or not call_id:
            raise InputError(f"{where} ({name}): the id must be a non-empty str, got {call_id!r}")
        return {"id": call_id, "type": "function", "function": function}
    return _AutoIdCall(id=f"call_{position}", type="function", function=function)


def _response(
    message: dict[str, Any],
    finish_reason: str,
    usage: Usage | tuple[int, int] | None,
    builder: str,
) -> dict[str, Any]:
    response: dict[str, Any] = {"choices": [{"message": message, "finish_reason": finish_reason}]}
    if usage is not None:
        prompt, completion = _usage_counts(usage, builder)
        response["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion}
    return response


def _usage_counts(usage: object, builder: str) -> tuple[int, int]:
    if isinstance(usage, Usage):
        return usage.prompt_tokens, usage.completion_tokens
    if isinstance(usage, tuple) and len(usage) == 2 and all(_is_count(n) for n in usage):
        return usage[0], usage[1]
    raise InputError(
        f"{builder}: usage must be a Usage or (prompt_tokens, completion_tokens) "
        f"with ints >= 0, got {usage!r}"
    )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_item(index: int, item: object) -> None:
    if isinstance(item, type) and issubclass(item, BaseException):
        raise InputError(
            f"ScriptedChat: script item {index} is the exception class {item.__name__}; "
            f"pass an instance, such as {item.__name__}('...')"
        )
    if not isinstance(item, dict | BaseException) and not callable(item):
        raise InputError(
            f"ScriptedChat: script item {index} is a {type(item).__name__}; each item must be "
            "a response dict, an exception instance or a function of the request"
        )


def _name(function: object) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


def _describe_last_message(request: dict[str, Any]) -> str:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "the request it could not answer has no messages"
    shown = repr(messages[-1])
    if len(shown) > _SHOWN:
        shown = shown[: _SHOWN - 3] + "..."
    return f"the last message of the request it could not answer: {shown}"
