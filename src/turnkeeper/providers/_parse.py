"""Read tool calls out of a model's plain-text reply, in the formats small models write.

Accepted: bare JSON objects or arrays (Python literals too), `<tool_call>` tags (an
unclosed last one too), fenced code blocks, pythonic calls `[fn(a=1)]`, `<|python_tag|>`
JSON (Llama) and `[TOOL_CALLS]` JSON (Mistral). `<think>` blocks are dropped first. A scan
is linear in the text (retries are bounded), and no input makes the parser raise: calls
nested in more than MAX_ARGUMENT_DEPTH levels of lists, or with arguments nested deeper
than that, are not read.
"""

from __future__ import annotations

import ast
import enum
import json
import math
import re
from typing import Any, Final

import msgspec

from turnkeeper.core import MAX_ARGUMENT_DEPTH, nests_deeper


class ParsedCall(msgspec.Struct, frozen=True):
    """One tool call read from a reply."""

    name: str
    arguments: dict[str, Any]


class ParsedReply(msgspec.Struct, frozen=True):
    """A reply split into prose and tool calls.

    `content` is the prose left after the calls are taken out (None when nothing remains);
    `unreadable` says some part looked like a tool call but could not be read (it stays
    in `content`).
    """

    content: str | None
    calls: tuple[ParsedCall, ...]
    unreadable: bool


class _Verdict(enum.Enum):
    NOT_CALL = "not a call"
    BAD = "an unreadable call"


_Calls = list[ParsedCall] | _Verdict

_THINK_OPEN: Final = "<think>"
_THINK_CLOSE: Final = "</think>"
_THINK_BLOCK: Final = re.compile(r"^[ \t]*<think>.*?(?:</think>|\Z)", re.MULTILINE | re.DOTALL)
_TAG_OPEN: Final = "<tool_call>"
_TAG_CLOSE: Final = "</tool_call>"
_PYTHON_TAG: Final = "<|python_tag|>"
_SPECIAL_TOKEN: Final = "<|"
_MISTRAL_TAG: Final = "[TOOL_CALLS]"
_MISTRAL_END: Final = "</s>"
_LLAMA_END_TOKENS: Final = ("<|eom_id|>", "<|eot_id|>")
_FENCE: Final = "```"

# Where something call-like may start: a tag, a fence, a JSON object or array of objects,
# or a pythonic list of calls. No nested quantifiers, so a search is linear in the text.
_START = re.compile(
    r"<tool_call>|<\|python_tag\|>|\[TOOL_CALLS\]|```"
    r"|\{\s*[\"']|\[\s*(?:\{|[A-Za-z_][\w.]*[ \t]*\()"
)
_FENCE_HEAD = re.compile(r"([A-Za-z][\w+-]*)?[ \t]*(?:\r?\n|(?=[\[{]))")
_CALL_FENCES: Final = frozenset({"", "json", "tool_call", "tool_code", "python", "py"})
# Fences whose body is a call even when written as a single `fn(...)`, not a list.
_SINGLE_CALL_FENCES: Final = frozenset({"tool_call", "tool_code"})
_CALL_HEAD = re.compile(r"[A-Za-z_][\w.]*[ \t]*\(")
_CALL_KEY = re.compile(r"[\"'](?:name|function|tool_calls)[\"']")
_ARGUMENT_KEYS: Final = ("arguments", "parameters", "args")
_JSON_NAMES: Final[dict[str, Any]] = {"true": True, "false": False, "null": None}
_DECODER: Final = json.JSONDecoder()
_FIRST_WINDOW: Final = 512
# A JSON token cut by the window's end fails within this many characters of it.
_LONGEST_TOKEN: Final = 16
_SEPARATORS: Final = frozenset(" \t\r\n,;")
_OPENERS: Final = {"(": ")", "[": "]", "{": "}"}


def parse_tool_calls(text: str) -> ParsedReply:
    """Split a model's text reply into prose and the tool calls written in it."""
    if _THINK_OPEN in text or _THINK_CLOSE in text:
        # The tags may be a call's own text (an argument that mentions them): then they
        # are read as written, and only tags outside every call mark reasoning.
        raw = _parse(text)
        if raw.calls and not raw.unreadable and _tags_only_in_calls(text, raw):
            return raw
    return _parse(_strip_think(text))


def _parse(visible: str) -> ParsedReply:
    whole = _whole_reply_call(visible.strip())
    if whole is not None:
        return whole
    return _Scan(visible).run()


def _tags_only_in_calls(text: str, reply: ParsedReply) -> bool:
    """Whether every think tag in `text` can be one inside the calls read from it."""
    if reply.content is not None and _tags_in(reply.content):
        return False
    inside = sum(_tags_in(call.name) + _tags_in_value(call.arguments) for call in reply.calls)
    return _tags_in(text) <= inside


def _tags_in(text: str) -> int:
    return text.count(_THINK_OPEN) + text.count(_THINK_CLOSE)


def _tags_in_value(value: object) -> int:
    if isinstance(value, str):
        return _tags_in(value)
    if isinstance(value, dict):
        return sum(_tags_in_value(key) + _tags_in_value(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return sum(_tags_in_value(item) for item in value)
    return 0


def _strip_think(text: str) -> str:
    """Drop reasoning: everything before a lone first `</think>`, then each `<think>` block
    that starts a line (to its `</think>`, or to the end when it is never closed). A tag
    inside a line is text: a call's arguments may hold one, and JSON or Python literals
    never hold a raw newline."""
    first_close = text.find(_THINK_CLOSE)
    if first_close != -1 and _THINK_OPEN not in text[:first_close]:
        text = text[first_close + len(_THINK_CLOSE) :]
    return _THINK_BLOCK.sub("", text)


def _whole_reply_call(reply: str) -> ParsedReply | None:
    """A reply that is one pythonic call `fn(a=1)`, or None when it is something else."""
    if not (_CALL_HEAD.match(reply) and reply.endswith(")")):
        return None
    node = _parse_python(reply)
    if node is None:
        return None
    verdict = _calls_from_python(node, single_ok=True)
    if verdict is _Verdict.NOT_CALL:
        return None
    if verdict is _Verdict.BAD:
        return ParsedReply(content=reply, calls=(), unreadable=True)
    return ParsedReply(content=None, calls=tuple(verdict), unreadable=False)


class _Scan:
    """One left-to-right pass over a reply, taking calls out and keeping the rest."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.kept: list[str] = []
        self.kept_to = 0
        self.calls: list[ParsedCall] = []
        self.unreadable = False
        # Re-scanning after a failed JSON candidate finds calls hidden behind stray
        # braces; the budget keeps adversarial text from making that quadratic.
        self.budget = 2 * len(text) + 4096

    def run(self) -> ParsedReply:
        cursor = 0
        while (match := _START.search(self.text, cursor)) is not None:
            token = match.group()
            start = match.start()
            if token == _TAG_OPEN:
                cursor = self._tool_call_tag(start, match.end())
            elif token == _PYTHON_TAG:
                cursor = self._python_tag(start, match.end())
            elif token == _MISTRAL_TAG:
                cursor = self._mistral_tag(start, match.end())
            elif token == _FENCE:
                cursor = self._fence(start, match.end())
            elif token.startswith("{") or token.endswith("{"):
                cursor = self._bare_json(start)
            else:
                cursor = self._pythonic_list(start)
        self.kept.append(self.text[self.kept_to :])
        content = "".join(self.kept).strip()
        return ParsedReply(
            content=content or None, calls=tuple(self.calls), unreadable=self.unreadable
        )

    def _settle(self, verdict: _Calls, start: int, end: int) -> None:
        """Take `text[start:end]` out as calls, or keep it as prose (flagged when unreadable)."""
        if isinstance(verdict, list):
            self.kept.append(self.text[self.kept_to : start])
            self.kept_to = end
            self.calls.extend(verdict)
        elif verdict is _Verdict.BAD:
            self.unreadable = True

    def _explicit(self, body: int, closers: tuple[str, ...], stop: str) -> tuple[_Calls, int]:
        """Read a tagged body as JSON values, else as pythonic calls.

        The body ends at one of `closers` (consumed), at `stop` (left for the next
        scan: the start of another tag) or at the end of the text. Returns the verdict
        and where the tagged part ends.
        """
        text = self.text
        values, after = _json_values(text, body)
        if values and (after == len(text) or text.startswith((*closers, stop), after)):
            verdict = _calls_from_json_values(values, explicit=True)
            body_end = after
        else:
            limit = text.find(stop, body)
            body_end = len(text) if limit == -1 else limit
            for closer in closers:
                found = text.find(closer, body, body_end)
                body_end = body_end if found == -1 else found
            node = _parse_python(text[body:body_end])
            verdict = (
                _Verdict.BAD
                if node is None
                else _calls_from_expression(node, single_ok=True, explicit=True)
            )
        for closer in closers:
            if text.startswith(closer, body_end):
                return verdict, body_end + len(closer)
        return verdict, body_end

    def _tool_call_tag(self, start: int, body: int) -> int:
        verdict, end = self._explicit(body, (_TAG_CLOSE,), _TAG_OPEN)
        self._settle(verdict, start, end)
        return end

    def _python_tag(self, start: int, body: int) -> int:
        verdict, end = self._explicit(body, _LLAMA_END_TOKENS, _SPECIAL_TOKEN)
        self._settle(verdict, start, end)
        return end

    def _mistral_tag(self, start: int, body: int) -> int:
        verdict, end = self._explicit(body, (_MISTRAL_END,), _MISTRAL_TAG)
        self._settle(verdict, start, end)
        return end

    def _fence(self, start: int, after_ticks: int) -> int:
        text = self.text
        head = _FENCE_HEAD.match(text, after_ticks)
        language = ((head.group(1) or "") if head else "").lower()
        body = head.end() if head else after_ticks
        closing = text.find(_FENCE, body)
        body_end = len(text) if closing == -1 else closing
        end = len(text) if closing == -1 else closing + len(_FENCE)
        if language not in _CALL_FENCES:
            return end
        values, after = _json_values(text, body)
        if values and (after == len(text) or text.startswith(_FENCE, after)):
            end = min(len(text), after + len(_FENCE))
            self._settle(_calls_from_json_values(values, explicit=False), start, end)
            return end
        source = text[body:body_end]
        node = _parse_python(source)
        if node is not None:
            single = language in _SINGLE_CALL_FENCES
            verdict = _calls_from_expression(node, single_ok=single, explicit=False)
        else:
            verdict = _Verdict.BAD if _CALL_KEY.search(source) else _Verdict.NOT_CALL
        self._settle(verdict, start, end)
        return end

    def _bare_json(self, start: int) -> int:
        decoded = _decode(self.text, start)
        if not isinstance(decoded, int):
            value, end = decoded
            self._settle(_calls_from_json(value, explicit=False), start, end)
            return end
        failed_at = max(decoded, start + 1)
        if self.budget > 0:
            # Not JSON; maybe a Python literal (single quotes, True, a trailing comma).
            end = _python_span_end(self.text, start)
            self.budget -= end - start
            node = _parse_python(self.text[start:end])
            if node is not None:
                verdict = _calls_from_expression(node, single_ok=False, explicit=False)
                if verdict is not _Verdict.NOT_CALL:
                    self._settle(verdict, start, end)
                    return end
        if _CALL_KEY.search(self.text, start, failed_at):
            self.unreadable = True
            return failed_at
        self.budget -= failed_at - start
        return start + 1 if self.budget > 0 else failed_at

    def _pythonic_list(self, start: int) -> int:
        end = _python_span_end(self.text, start)
        node = _parse_python(self.text[start:end])
        verdict = _Verdict.BAD if node is None else _calls_from_python(node, single_ok=False)
        self._settle(verdict, start, end)
        return end


def _decode(text: str, pos: int) -> tuple[Any, int] | int:
    """The JSON value starting at `pos` and where it ends, or where decoding failed."""
    # Decode a growing window, not the whole text: a JSONDecodeError costs time in
    # proportion to its offset in the string decoded (it counts lines).
    window = _FIRST_WINDOW
    while True:
        piece = text[pos : pos + window]
        try:
            value, end = _DECODER.raw_decode(piece)
        except json.JSONDecodeError as error:
            cut_short = pos + len(piece) < len(text) and (
                error.pos >= len(piece) - _LONGEST_TOKEN or error.msg.startswith("Unterminated")
            )
            if cut_short:
                window *= 4
                continue
            return pos + error.pos
        except (ValueError, RecursionError):
            # Over-long integers or too-deep nesting: nothing readable lies past here.
            return len(text)
        return value, pos + end


def _json_values(text: str, pos: int) -> tuple[list[Any], int]:
    """JSON objects and arrays from `pos` on, separated by blanks, commas or semicolons.

    Returns the values and where reading stopped (just past the last value read and
    any blanks after it).
    """
    values: list[Any] = []
    after = pos
    while True:
        while pos < len(text) and text[pos] in _SEPARATORS:
            pos += 1
        if pos >= len(text) or text[pos] not in "{[":
            break
        decoded = _decode(text, pos)
        if isinstance(decoded, int):
            break
        value, pos = decoded
        values.append(value)
        after = pos
        while after < len(text) and text[after].isspace():
            after += 1
    return values, after


def _calls_from_json_values(values: list[Any], *, explicit: bool) -> _Calls:
    return _calls_from_json(values[0] if len(values) == 1 else values, explicit=explicit)


def _calls_from_json(value: Any, *, explicit: bool, depth: int = 0) -> _Calls:
    """The calls a decoded JSON value holds; `explicit` when the text was marked as a call.
    `depth` counts the lists and objects `value` is in: calls nested too deep are not read."""
    if isinstance(value, list):
        if depth >= MAX_ARGUMENT_DEPTH:
            return _Verdict.BAD if explicit else _Verdict.NOT_CALL
        verdicts = [_calls_from_json(item, explicit=explicit, depth=depth + 1) for item in value]
        calls = [call for verdict in verdicts if isinstance(verdict, list) for call in verdict]
        if verdicts and len(calls) == len(verdicts):
            return calls
        if explicit or any(verdict is not _Verdict.NOT_CALL for verdict in verdicts):
            return _Verdict.BAD
        return _Verdict.NOT_CALL
    if not isinstance(value, dict):
        return _Verdict.BAD if explicit else _Verdict.NOT_CALL
    if isinstance(value.get("tool_calls"), list):
        return _calls_from_json(value["tool_calls"], explicit=True, depth=depth + 1)
    function = value.get("function")
    if isinstance(function, dict):
        return _call(function.get("name"), _arguments_of(function, required=False))
    if "function" in value or "name" in value:
        name = value.get("function", value.get("name"))
        arguments = _arguments_of(value, required=not explicit)
        if arguments is _MISSING:
            return _Verdict.NOT_CALL
        return _call(name, arguments)
    return _Verdict.BAD if explicit else _Verdict.NOT_CALL


_MISSING: Final = object()


def _arguments_of(holder: dict[str, Any], *, required: bool) -> object:
    """The arguments of a call object (an empty dict when absent and not required)."""
    for key in _ARGUMENT_KEYS:
        if key in holder:
            return holder[key]
    return _MISSING if required else {}


def _call(name: object, arguments: object) -> _Calls:
    if isinstance(arguments, str):
        arguments = _decode_argument_string(arguments)
    if arguments is None:
        arguments = {}
    if not (isinstance(name, str) and name.strip() and isinstance(arguments, dict)):
        return _Verdict.BAD
    # Deeper ones are bad arguments to the session too, and would recurse in what follows.
    if nests_deeper(arguments, MAX_ARGUMENT_DEPTH):
        return _Verdict.BAD
    return [ParsedCall(name=name.strip(), arguments=arguments)]


def _decode_argument_string(arguments: str) -> object:
    """Arguments sent as a JSON-encoded string, as the OpenAI wire format does."""
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return _MISSING


def _parse_python(source: str) -> ast.expr | None:
    """The expression `source` holds, or None when it is not one Python expression."""
    try:
        return ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _python_span_end(text: str, start: int) -> int:
    """Just past the bracket matching the one at `start`, honouring strings; else the end."""
    closers: list[str] = []
    quote = ""
    pos = start
    while pos < len(text):
        char = text[pos]
        if quote:
            if char == "\\":
                pos += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in _OPENERS:
            closers.append(_OPENERS[char])
        elif closers and char == closers[-1]:
            closers.pop()
            if not closers:
                return pos + 1
        pos += 1
    return len(text)


def _calls_from_expression(node: ast.expr, *, single_ok: bool, explicit: bool) -> _Calls:
    """Calls in a Python expression: pythonic calls, or a literal shaped like JSON calls."""
    verdict = _calls_from_python(node, single_ok=single_ok)
    if verdict is not _Verdict.NOT_CALL:
        return verdict
    try:
        value = _literal(node)
    except (ValueError, RecursionError):
        return _Verdict.BAD if explicit else _Verdict.NOT_CALL
    return _calls_from_json(value, explicit=explicit)


def _calls_from_python(node: ast.expr, *, single_ok: bool) -> _Calls:
    """The calls a pythonic expression holds: a list of calls, or one call when `single_ok`."""
    if isinstance(node, ast.List | ast.Tuple):
        if not node.elts:
            return _Verdict.NOT_CALL
        if not all(isinstance(element, ast.Call) for element in node.elts):
            has_call = any(isinstance(element, ast.Call) for element in node.elts)
            return _Verdict.BAD if has_call else _Verdict.NOT_CALL
        calls: list[ParsedCall] = []
        for element in node.elts:
            verdict = _python_call(element)
            if not isinstance(verdict, list):
                return verdict
            calls.extend(verdict)
        return calls
    if isinstance(node, ast.Call) and single_ok:
        return _python_call(node)
    return _Verdict.NOT_CALL


def _python_call(node: ast.expr) -> _Calls:
    if not isinstance(node, ast.Call) or node.args:
        return _Verdict.BAD
    arguments: dict[str, Any] = {}
    try:
        name = _dotted_name(node.func)
        for keyword in node.keywords:
            if keyword.arg is None or keyword.arg in arguments:
                return _Verdict.BAD
            arguments[keyword.arg] = _literal(keyword.value)
    except (ValueError, RecursionError):
        return _Verdict.BAD
    return _call(name, arguments)


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted_name(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def _literal(node: ast.expr) -> Any:
    """A JSON-compatible value from a literal expression; ValueError for anything else."""
    if isinstance(node, ast.Constant):
        constant = node.value
        if constant is None or isinstance(constant, str | bool | int):
            return constant
        if isinstance(constant, float) and math.isfinite(constant):
            return constant
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _literal(node.operand)
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    elif isinstance(node, ast.List | ast.Tuple):
        return [_literal(element) for element in node.elts]
    elif isinstance(node, ast.Dict):
        result: dict[str, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            name = None if key is None else _literal(key)
            if not isinstance(name, str):
                break
            result[name] = _literal(value)
        else:
            return result
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise ValueError("not a literal")
