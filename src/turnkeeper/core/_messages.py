"""Pure helpers over OpenAI-shaped messages: text, tool calls, canonical arguments, tool answers."""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from turnkeeper.core._depth import nests_deeper
from turnkeeper.core._types import Message, ToolUse

MAX_ARGUMENT_DEPTH: Final = 64
"""How deep a tool call's arguments may nest (the arguments object is level 1); deeper ones
are bad arguments. Decoding, encoding, repr and the log's round trip recurse once per level,
validation against a recursive schema 4 to 6 stack frames a level, and each fails when the
stack reaches Python's limit of 1000 frames: past about 950 levels (160 for that validation)
at the top of a stack, fewer deeper in one."""
MAX_JSON_DEPTH: Final = 2 * MAX_ARGUMENT_DEPTH
"""How deep a model response or a request body may nest: room for arguments at their
deepest inside one, and still far below where anything recursing over it fails."""

_canonical = msgspec.json.Encoder(order="sorted")
_compact = msgspec.json.Encoder()
_decode = msgspec.json.Decoder().decode
# What encoding arguments that JSON cannot hold raises.
_UNENCODABLE = (TypeError, msgspec.EncodeError, OverflowError, ValueError)
_SEQUENCES = (list, tuple)
_TOO_DEEP: Final = (
    f"arguments are nested too deeply (more than {MAX_ARGUMENT_DEPTH} levels of objects and arrays)"
)


def canonical_args(arguments: dict[str, Any]) -> str:
    """Arguments as JSON with sorted keys, so equal arguments compare equal as text."""
    try:
        return _canonical.encode(arguments).decode()
    except _UNENCODABLE:
        return repr(sorted(arguments.items(), key=lambda item: item[0]))


def digest(text: str) -> str:
    """A short stable fingerprint of `text`."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def text_of(message: Message) -> str | None:
    """The text of a message's content (text parts joined), or None when it has none."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "".join(parts) if parts else None
    return None


def decode_arguments(arguments: object) -> tuple[dict[str, Any], str | None]:
    """A tool call's arguments as a dict, and why they were replaced by `{}` if they were bad
    (not JSON, not an object, or nested more than MAX_ARGUMENT_DEPTH levels deep)."""
    if isinstance(arguments, str):
        # Decoded first: a blank string is the only one that fails and is not an error.
        try:
            value = _decode(arguments)
        except msgspec.DecodeError as exc:
            if not arguments.strip():
                return {}, None
            return {}, f"arguments are not valid JSON ({exc}): {arguments[:200]!r}"
        except RecursionError:  # msgspec's decoder, on nesting deeper than the stack allows
            return {}, f"{_TOO_DEEP}: {arguments[:200]!r}"
        if not isinstance(value, dict):
            kind = type(value).__name__
            return {}, f"arguments must be a JSON object, got {kind}: {arguments[:200]!r}"
        # Each level opens a bracket: with no more brackets than levels allowed (as in
        # nearly every call), there is nothing to walk.
        brackets = arguments.count("{") + arguments.count("[")
        if brackets > MAX_ARGUMENT_DEPTH and nests_deeper(value, MAX_ARGUMENT_DEPTH):
            return {}, f"{_TOO_DEEP}: {arguments[:200]!r}"
        return value, None
    if isinstance(arguments, dict):
        if nests_deeper(arguments, MAX_ARGUMENT_DEPTH):
            return {}, _TOO_DEEP
        return arguments, None
    if arguments is None:
        return {}, None
    return {}, f"arguments must be a JSON object, got {type(arguments).__name__}"


_decoded: dict[int, tuple[Message, tuple[ToolUse, ...]]] = {}


def tool_uses_of(message: Message) -> tuple[ToolUse, ...]:
    """The tool calls of a well-formed assistant message, arguments decoded."""
    # A poll decodes the same (never mutated) messages several times: remember the last few.
    known = _decoded.get(id(message))
    if known is not None and known[0] is message:
        return known[1]
    uses = decode_tool_uses(message)
    if len(_decoded) >= 8:
        _decoded.clear()
    _decoded[id(message)] = (message, uses)
    return uses


def decode_tool_uses(message: Message) -> tuple[ToolUse, ...]:
    """The tool calls of a well-formed assistant message, arguments decoded, each time
    (`tool_uses_of` remembers the last few). Raises TypeError when `tool_calls` is not a
    list of calls with string ids and names."""
    calls = message.get("tool_calls")
    if not calls:
        return ()
    if not isinstance(calls, _SEQUENCES):
        raise TypeError(f"tool_calls is {type(calls).__name__}, not a list")
    uses: list[ToolUse] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and isinstance(call_id := call.get("id"), str)
            and isinstance(name := function.get("name"), str)
        ):
            raise TypeError(f"tool_calls[{len(uses)}] has no string id and function name")
        uses.append(ToolUse(call_id, name, *decode_arguments(function.get("arguments"))))
    return tuple(uses)


def tool_message(tool_call_id: str, content: str) -> Message:
    """A `tool` message answering `tool_call_id`."""
    return {"role": "tool", "tool_call_id": tool_call_id, "content": content}


def error_content(text: str) -> str:
    """How an error result is sent to the model."""
    return _compact.encode({"error": text, "isError": True}).decode()


def duplicate_content(message: str) -> str:
    """How a self-answered duplicate call is sent to the model."""
    return _compact.encode({"duplicate": True, "message": message}).decode()


def call_key(name: str, arguments: dict[str, Any]) -> str:
    """The identity of a call within an episode: its tool name and canonical arguments, split
    at the last \x1f (canonical JSON never holds a raw control character). A string, whose
    hash Python keeps, so sets of keys are cheap to grow."""
    try:
        return f"{name}\x1f{_canonical.encode(arguments).decode()}"
    except _UNENCODABLE:
        return f"{name}\x1f{canonical_args(arguments)}"


def key_arguments(key: str) -> str:
    """The canonical arguments of a call key."""
    return key.rpartition("\x1f")[2]


def gist(text: str, limit: int = 300) -> str:
    """`text` on one line, cut to about `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def last_answer(history: tuple[Message, ...]) -> str | None:
    """The text of the last assistant message in history, or None."""
    for message in reversed(history):
        if message.get("role") == "assistant":
            return text_of(message)
    return None
