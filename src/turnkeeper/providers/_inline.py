"""Inline tools: tool calling for chat backends whose chat template has no tools.

The tools go into the system prompt with a JSON reply format; earlier calls and results in
the history are rewritten as plain turns; the reply text is parsed back into OpenAI-shaped
tool calls. With `grammar=True` the request also carries a JSON schema (llama.cpp's
`response_format`) that admits only a call of an offered tool with schema-valid arguments,
or a final answer.

The final answer is a call too, of the `final_answer` pseudo-tool: measured on
SmolLM2-135M, a separate `{"answer": ...}` shape drew the model away from calling tools at
all, and a worked example with concrete values was copied into its calls, so the example
shows each argument's type instead. For the same reason a reply with tools withdrawn
(`tool_choice: "none"`) is constrained to a `final_answer` call rather than to free prose:
asked to answer from a history of calls and results, the model given a prose-only grammar
answered none of five questions, and given the answer call, four.

A request for JSON of a schema (`response_format` of type `json_schema`, as a session
with an `output_schema` sends) makes the schema `final_answer`'s arguments (an object
schema as they are, any other under `answer`), offered even to a request without tools:
the grammar then admits only an answer of that schema, and the answer comes back as its
JSON text. A reply written as any other JSON (not as a call of an offered tool) is taken
as the answer as written, never as a call.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

import jiter

from turnkeeper.core import (
    FINAL_TURN_LEAD,
    MAX_ARGUMENT_DEPTH,
    MAX_JSON_DEPTH,
    Chat,
    ChatError,
    nests_deeper,
)
from turnkeeper.events import TokenDelta
from turnkeeper.providers._parse import ParsedCall, ParsedReply, parse_tool_calls
from turnkeeper.providers._stream import DeltaSink, delta_sink, streaming_to

FINAL_TURN_PREFIX: Final = FINAL_TURN_LEAD.rstrip(".")
"""How the final-turn directive begins; on it the reply is constrained to an answer."""

RESULT_CHARS: Final = 1500
"""Longest tool result written back into the history, in characters."""

ANSWER_TOOL: Final = "final_answer"
"""The pseudo-tool through which the model gives its final answer (unless a real tool has
this name); its one argument is `text`."""

_ANSWER_ARGUMENT: Final = "text"
_ANSWER_KEY: Final = "answer"
_NAMED_IN_DIRECTIVE = re.compile(r"`([^`]+)`")
_FENCED = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\r?\n?(.*?)\r?\n?[ \t]*```", re.DOTALL)
# Fields a backend without chat-template tools may reject.
_TOOL_FIELDS: Final = ("tools", "tool_choice", "parallel_tool_calls")
_ANSWER_FUNCTION: Final[dict[str, Any]] = {
    "name": ANSWER_TOOL,
    "description": "Give the user your final answer.",
    "parameters": {
        "type": "object",
        "properties": {_ANSWER_ARGUMENT: {"type": "string"}},
        "required": [_ANSWER_ARGUMENT],
    },
}
_DEFINITIONS: Final = ("$defs", "definitions")
"""Where a schema keeps the subschemas its `$ref`s name (2020-12's, draft-07's)."""


class _Answer:
    """How a reply gives its final answer: the `final_answer` function offered, the output
    schema it carries (None for a plain answer, its `text`), whether that schema is under
    `answer` (one that is not an object), and the schema's definitions, which a reply
    schema holding it must hold at its root for its `$ref`s to resolve."""

    def __init__(self, output: dict[str, Any] | None) -> None:
        self.output = output
        self.wrapped = False
        self.definitions: dict[str, Any] = {}
        if output is None:
            self.function = _ANSWER_FUNCTION
            return
        parameters = {key: value for key, value in output.items() if key not in _DEFINITIONS}
        self.definitions = {key: output[key] for key in _DEFINITIONS if key in output}
        if parameters.get("type") != "object":
            self.wrapped = True
            parameters = {
                "type": "object",
                "properties": {_ANSWER_KEY: parameters},
                "required": [_ANSWER_KEY],
            }
        self.function = {
            "name": ANSWER_TOOL,
            "description": "Give the user your final answer, as these arguments.",
            "parameters": parameters,
        }

    def text(self, arguments: dict[str, Any]) -> str:
        """The answer's text from the arguments of a `final_answer` call: for an output
        schema, the answer as JSON; else the `text` argument (else all, as JSON)."""
        if self.output is not None:
            value = arguments.get(_ANSWER_KEY) if self.wrapped else arguments
            return json.dumps(value, ensure_ascii=False)
        text = arguments.get(_ANSWER_ARGUMENT)
        if isinstance(text, str) and len(arguments) == 1:
            return text
        return json.dumps(arguments, ensure_ascii=False)


def _answer_of_request(request: dict[str, Any]) -> _Answer:
    """How a reply to `request` gives its final answer (see `_Answer`)."""
    response_format = request.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        described = response_format.get("json_schema")
        schema = described.get("schema") if isinstance(described, dict) else None
        if isinstance(schema, dict):
            return _Answer(schema)
    return _Answer(None)


class InlineTools:
    """A chat backend that gives `chat` tool calling through the prompt and the reply text.

    Use it for a backend whose chat template has no tools: a small local model, or an
    OpenAI-compatible server that ignores `tools`. `grammar=True` sends llama.cpp's
    `response_format={"type": "json_object", "schema": ...}` so every reply is a
    well-formed call of an offered tool or of `final_answer`; leave it off for servers
    that do not accept a schema there. The request's `tool_choice` is honoured: `"none"`
    withdraws the tools (the reply is an answer), `"required"` withdraws `final_answer`,
    and a named function is the only one offered. The response is OpenAI-shaped, with
    `tool_calls` and finish_reason `tool_calls` when the reply held calls, and the final
    answer (or the prose) as content, finish_reason `stop`; the reply's own text, and
    whether part of it looked like a call but could not be read, are kept under the
    response's `turnkeeper` field (`reply_text`, `unreadable`). A streamed call (see
    `delta_sink`) sends on what the reply will be as it comes: an answer's text, a
    call's tool name, then at the end its arguments; if what was sent is not how the
    response begins (an unreadable reply), its text starts over (`DeltaSink.restart`).
    """

    def __init__(self, chat: Chat, *, grammar: bool = False) -> None:
        self._chat = chat
        self._grammar = grammar

    @property
    def grammar(self) -> bool:
        """Whether requests carry a JSON-schema constraint on the reply."""
        return self._grammar

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        outer = delta_sink()
        if outer is None:
            response = await self._chat(inline_request(request, grammar=self._grammar))
            return inline_response(response, request)
        # Streamed: the reply's text is read as it comes, and what the reply will be is
        # sent on (its answer's text, a call's tool), not the reply's JSON.
        reader = _ReplyReader(outer, parses=_parses(request))
        with streaming_to(reader):
            response = await self._chat(inline_request(request, grammar=self._grammar))
        answered = inline_response(response, request)
        reader.finish(answered)
        return answered


def inline_request(request: dict[str, Any], *, grammar: bool) -> dict[str, Any]:
    """`request` rewritten for a backend without chat-template tools.

    The tools move into the system prompt, assistant tool calls and `tool` messages become
    plain turns (results cut to `RESULT_CHARS`), and consecutive turns of one role are
    joined, as strict chat templates require. With `grammar`, `response_format` constrains
    the reply to a call of one of the tools or of `final_answer`; on a final-turn
    directive, to a call of the tools it names, else to `final_answer` alone. The
    request's `tool_choice` narrows what is offered (see `InlineTools`); `"none"` offers
    `final_answer` alone, even to a request without tools. A `tool_choice` that is not
    `"none"`, `"auto"`, `"required"` or a function of the request is a permanent ChatError.
    """
    tools = [_function_of(tool) for tool in request.get("tools") or []]
    choice = tool_choice_of(request)
    answer = _answer_of_request(request)
    rewritten = {key: value for key, value in request.items() if key not in _TOOL_FIELDS}
    if answer.output is not None:
        # Replaced by the call format (and its grammar): the answer is a call's arguments.
        del rewritten["response_format"]
    messages = _plain_history(list(request.get("messages") or []))
    if tools or choice == "none" or answer.output is not None:
        allowed = _tools_allowed(request, tools, choice, answer.function)
        if choice == "none" or not tools:
            prompt = answer_prompt(
                results=any(m.get("role") == "tool" for m in _dicts(request)),
                answer=answer.function if answer.output is not None else None,
            )
        else:
            # A final-turn directive narrows only the grammar; a tool_choice, the prompt too.
            listed = tools if choice is None else allowed
            prompt = tool_prompt(
                listed, grammar=grammar, answer=choice is None, answer_tool=answer.function
            )
        messages = _with_system_text(messages, prompt)
        if grammar:
            schema = reply_schema(allowed)
            rewritten["response_format"] = {
                "type": "json_object",
                "schema": {**answer.definitions, **schema} if answer.definitions else schema,
            }
    rewritten["messages"] = messages
    return rewritten


def tool_choice_of(request: dict[str, Any]) -> str | None:
    """The request's `tool_choice` as `"none"`, `"required"`, the name of the one function
    to call, or None for `"auto"` (and when it is absent). Raises a permanent ChatError
    for anything else, or a function the request's tools do not have."""
    choice = request.get("tool_choice")
    if choice is None or choice == "auto":
        return None
    if choice == "none":
        return "none"
    if choice == "required":
        if not request.get("tools"):
            raise ChatError('tool_choice "required": the request has no tools', transient=False)
        return "required"
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise ChatError(
            f'tool_choice: expected "none", "auto", "required" or {{"type": "function", '
            f'"function": {{"name": ...}}}}, got {json.dumps(choice, default=repr)[:120]}',
            transient=False,
        )
    if not _offers(request, name):
        raise ChatError(
            f"tool_choice: the function {name[:80]!r} is not among the request's tools",
            transient=False,
        )
    return name


def inline_response(response: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The backend's `response` to the inline form of `request`, with calls read from its text.

    A response that already has tool calls, or answers a request without tools, is
    returned unchanged. Otherwise the first choice's text is parsed: calls become
    `tool_calls` (ids derived from the request and the reply, arguments as JSON strings)
    with finish_reason `tool_calls`; a `final_answer` call (or `{"answer": ...}`) becomes
    the content; prose stays content. The text and an `unreadable` flag go under
    `response["turnkeeper"]`.
    """
    choices = response.get("choices")
    withdrawn = tool_choice_of(request) == "none"
    answering = _answer_of_request(request)
    typed = answering.output is not None
    if (
        not (request.get("tools") or withdrawn or typed)
        or not isinstance(choices, list)
        or not choices
    ):
        return response
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict) or message.get("tool_calls"):
        return response
    text = message.get("content")
    if not isinstance(text, str):
        return response
    answer = _typed_answer(text, request, answering) if typed else _answer_of(text)
    parsed = ParsedReply(answer, (), False) if answer is not None else parse_tool_calls(text)
    content, calls, unreadable = parsed.content, list(parsed.calls), parsed.unreadable
    if withdrawn or typed or not _offers(request, ANSWER_TOOL):
        answers = [answering.text(call.arguments) for call in calls if call.name == ANSWER_TOOL]
        calls = [call for call in calls if call.name != ANSWER_TOOL]
        content = "\n\n".join(part for part in [content, *answers] if part) or None
    if withdrawn and calls:
        # Tools were withdrawn, so no call is surfaced: the reply is the answer as written.
        calls, content = [], text
    if not calls and content is not None and _names_a_tool(content, request):
        # Measured on SmolLM2-135M: having written `"name": "final_answer"`, it answered
        # "final_answer", the name copied into the text. That is no answer: a bad reply.
        unreadable = True
    new_message = {**message, "content": content}
    finish_reason = choice.get("finish_reason")
    if calls:
        salt = _digest(request.get("messages"), text)
        new_message["tool_calls"] = [
            _tool_call(call, f"call_{_digest(salt, index)[:24]}")
            for index, call in enumerate(calls)
        ]
        finish_reason = "tool_calls"
    elif finish_reason != "length":
        finish_reason = "stop"
    new_choice = {**choice, "message": new_message, "finish_reason": finish_reason}
    return {
        **response,
        "choices": [new_choice, *choices[1:]],
        "turnkeeper": {"reply_text": text, "unreadable": unreadable},
    }


def _parses(request: dict[str, Any]) -> bool:
    """Whether `inline_response` reads calls and answers out of the reply to `request`."""
    return bool(request.get("tools")) or request.get("tool_choice") == "none"


class _ReplyReader(DeltaSink):
    """The sink of a streamed inline call: it reads the reply's text as it comes and sends
    `outer` what the reply will be. Prose is sent as it is; a reply in the JSON form, read
    with jiter's partial parsing at each piece, sends its answer's text as content, and a
    call's tool name once it is whole. `finish` then sends what is left of the response,
    or, if what was sent is not the start of its content, starts the text over."""

    __slots__ = ("named", "native", "outer", "parses", "raw", "sent")

    def __init__(self, outer: DeltaSink, *, parses: bool) -> None:
        super().__init__(self._read, outer.session_id, outer.after)
        self.outer = outer
        self.parses = parses
        self.raw = ""
        self.sent = ""
        self.named: str | None = None
        self.native = False

    def _read(self, delta: TokenDelta) -> None:
        if delta.tool_call is not None:
            # A backend with tools of its own: its calls are the reply's.
            self.native = True
            self.outer.tool_call(delta.tool_call, delta.text, delta.name)
            return
        self.raw += delta.text
        if not self.parses or not self.raw.lstrip().startswith("{"):
            self._content(self.raw)
            return
        try:
            value = jiter.from_json(self.raw.encode(), partial_mode="trailing-strings")
        except ValueError:
            return  # not JSON after all: `finish` sends the content
        if not isinstance(value, dict):
            return
        name, arguments = value.get("name"), value.get("arguments")
        if isinstance(value.get(_ANSWER_KEY), str):
            self._content(value[_ANSWER_KEY])
        elif name == ANSWER_TOOL and isinstance(arguments, dict):
            if isinstance(arguments.get(_ANSWER_ARGUMENT), str):
                self._content(arguments[_ANSWER_ARGUMENT])
        elif isinstance(name, str) and "arguments" in value and self.named is None:
            # Its name is whole once its arguments begin; they are sent at the end, as the
            # response has them.
            self.named = name
            self.outer.tool_call(0, "", name)

    def restart(self) -> None:
        super().restart()
        self.raw, self.sent, self.named = "", "", None
        self.outer.restart()

    def _content(self, text: str) -> None:
        if text.startswith(self.sent) and len(text) > len(self.sent):
            piece, self.sent = text[len(self.sent) :], text
            self.outer.text(piece)

    def finish(self, response: dict[str, Any]) -> None:
        """Send what the response has that was not sent as it streamed."""
        message = response["choices"][0]["message"]
        content = message.get("content")
        content = content if isinstance(content, str) else ""
        if not content.startswith(self.sent):
            self.outer.restart()
            self.sent, self.named = "", None
        self._content(content)
        calls = message.get("tool_calls") if not self.native else None
        for index, call in enumerate(calls if isinstance(calls, list) else ()):
            function = call["function"]
            named = index == 0 and self.named == function["name"]
            self.outer.tool_call(index, function["arguments"], None if named else function["name"])


def reply_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of a reply: one call of one of `tools` with schema-valid arguments.

    `tools` are OpenAI `function` objects (`name`, `parameters`); include `final_answer`'s
    (see `with_answer_tool`) to admit a final answer.
    """
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["name"]},
                    "arguments": _parameters_of(tool),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for tool in tools
        ]
    }


def with_answer_tool(
    tools: list[dict[str, Any]], answer: dict[str, Any] = _ANSWER_FUNCTION
) -> list[dict[str, Any]]:
    """`tools` and the `final_answer` pseudo-tool (`answer`, its function), unless one of
    them already has its name."""
    if any(tool["name"] == ANSWER_TOOL for tool in tools):
        return tools
    return [*tools, answer]


def _function_of(tool: Any) -> dict[str, Any]:
    """The `function` object of an OpenAI tool (or the tool itself when given bare)."""
    if isinstance(tool, dict):
        function = tool.get("function", tool)
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return function
    return {"name": str(tool), "parameters": {"type": "object", "properties": {}}}


def _parameters_of(tool: dict[str, Any]) -> dict[str, Any]:
    parameters = tool.get("parameters")
    if isinstance(parameters, dict) and parameters:
        return parameters
    return {"type": "object", "properties": {}}


def _tools_allowed(
    request: dict[str, Any],
    tools: list[dict[str, Any]],
    choice: str | None,
    answer: dict[str, Any],
) -> list[dict[str, Any]]:
    """The tools a reply may call: for `tool_choice` "none", `final_answer` (`answer`, its
    function) alone; for "required", every tool; for a named function, that one. Else all
    and `final_answer`, and on a final-turn directive the tools it names, else
    `final_answer` alone."""
    if choice == "none":
        return with_answer_tool([], answer)
    if choice == "required":
        return tools
    if choice is not None:
        return [tool for tool in tools if tool["name"] == choice][:1]
    directive = _last_user_text(request.get("messages") or [])
    if directive is None or not directive.startswith(FINAL_TURN_PREFIX):
        return with_answer_tool(tools, answer)
    named = set(_NAMED_IN_DIRECTIVE.findall(directive))
    return [tool for tool in tools if tool["name"] in named] or with_answer_tool([], answer)


def _offers(request: dict[str, Any], name: str) -> bool:
    return any(_function_of(tool)["name"] == name for tool in request.get("tools") or [])


def _last_user_text(messages: list[Any]) -> str | None:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return None


def _with_system_text(messages: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    """`messages` with `prompt` appended to the system message (made if none)."""
    if messages and messages[0].get("role") == "system":
        system = _text_of(messages[0].get("content"))
        head = {**messages[0], "content": f"{system}\n\n{prompt}" if system else prompt}
        return [head, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def tool_prompt(
    tools: list[dict[str, Any]],
    *,
    grammar: bool,
    answer: bool = True,
    answer_tool: dict[str, Any] = _ANSWER_FUNCTION,
) -> str:
    """The system-prompt section that lists `tools` (and `final_answer`, `answer_tool`,
    with `answer`) and the reply format, with a worked example for the first (its
    arguments' types, not values, which a small model copies)."""
    listed = with_answer_tool(tools, answer_tool) if answer else tools
    lines = ["You can use these tools:"]
    for tool in listed:
        lines.extend(_tool_lines(tool))
    first = listed[0]
    lines += [
        "",
        "To use a tool, reply with only a JSON object, nothing else:",
        '{"name": "<tool name>", "arguments": {<argument values>}}',
        f"For example, to call {first['name']}: {_example_call(first)}",
        "The tool's result comes back to you in the next message.",
    ]
    if not answer:
        lines.append("Call one of these tools now.")
    elif grammar or answer_tool is not _ANSWER_FUNCTION:
        # A typed answer is a call's arguments only: no plain text to fall back on.
        lines.append(f"When you know the final answer, call {ANSWER_TOOL} with it.")
    else:
        lines.append(
            f"When you know the final answer, call {ANSWER_TOOL} with it, or reply with it "
            "in plain text."
        )
    return "\n".join(lines)


def answer_prompt(*, results: bool, answer: dict[str, Any] | None = None) -> str:
    """The system-prompt section for a reply with tools withdrawn: the answer call's format,
    and with `results`, to answer from them. Measured on SmolLM2-135M over 8 questions
    answered from a tool result: right on 7 with a system prompt before it and 7 without
    (with the answer shown as `<your answer as a string>`, unquoted: 7 and 6; as `"..."`,
    5 and 5, the model copying words of the question). With `answer`, the function of a
    typed answer, the format shows its arguments' types, and each argument is listed."""
    source = " from the results above," if results else ""
    if answer is not None:
        lines = _tool_lines(answer)[1:]
        listed = "".join(f"\n{line.strip()}" for line in lines)
        return (
            f"Reply with your final answer to the user's request,{source} as only this JSON "
            f"object:\n{_example_call(answer)}{listed}"
        )
    return (
        f"Reply with your final answer to the user's request,{source} as only this JSON "
        f'object:\n{{"name": "{ANSWER_TOOL}", "arguments": {{"{_ANSWER_ARGUMENT}": '
        '"<your answer>"}}'
    )


def _dicts(request: dict[str, Any]) -> list[dict[str, Any]]:
    messages = request.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def _tool_lines(tool: dict[str, Any]) -> list[str]:
    """`- name(arg: type, opt?: type): description`, then one line per described argument."""
    parameters = _parameters_of(tool)
    properties = parameters.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = parameters.get("required")
    required = set(required) if isinstance(required, list) else set()
    signature = ", ".join(
        f"{name}{'' if name in required else '?'}: {_type_of(schema)}"
        for name, schema in properties.items()
    )
    description = str(tool.get("description") or "").strip()
    head = f"- {tool['name']}({signature})"
    lines = [f"{head}: {description}" if description else head]
    for name, schema in properties.items():
        if isinstance(schema, dict) and schema.get("description"):
            lines.append(f"    {name}: {str(schema['description']).strip()}")
    return lines


def _type_of(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("enum"), list):
        return " | ".join(json.dumps(value, ensure_ascii=False) for value in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(str(item) for item in kind)
    if kind == "array":
        return f"array of {_type_of(schema.get('items'))}"
    return str(kind) if kind else "any"


def _example_call(tool: dict[str, Any]) -> str:
    """`{"name": "add", "arguments": {"a": <integer>, "b": <integer>}}`: the required
    arguments (else the first one), each as its type."""
    parameters = _parameters_of(tool)
    properties = parameters.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = parameters.get("required")
    names = [name for name in properties if isinstance(required, list) and name in required]
    shown = ", ".join(
        f"{json.dumps(name, ensure_ascii=False)}: <{_type_of(properties[name])}>"
        for name in names or list(properties)[:1]
    )
    return f'{{"name": {json.dumps(tool["name"], ensure_ascii=False)}, "arguments": {{{shown}}}}}'


def _plain_history(messages: list[Any]) -> list[dict[str, Any]]:
    """The history with tool calls and results as plain turns, same-role turns joined."""
    names: dict[str, str] = {}
    plain: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        text = _text_of(message.get("content"))
        if role == "assistant" and message.get("tool_calls"):
            written = [text] if text else []
            for call in message["tool_calls"]:
                name, arguments, call_id = _call_parts(call)
                names[call_id] = name
                written.append(json.dumps({"name": name, "arguments": arguments}))
            plain.append({"role": "assistant", "content": "\n".join(written)})
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id")), "the tool")
            plain.append({"role": "user", "content": f"Result of {name}: {_cut(text)}"})
        else:
            plain.append({"role": role, "content": text})
    return _joined(plain)


def _call_parts(call: Any) -> tuple[str, Any, str]:
    """A tool call's name, decoded arguments (`{}` if unreadable or nested more than
    MAX_ARGUMENT_DEPTH levels deep, as the session took them) and id."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    raw = function.get("arguments")
    arguments: Any = raw if isinstance(raw, dict) else {}
    if isinstance(raw, str):
        try:
            arguments = json.loads(raw)
        except (ValueError, RecursionError):
            arguments = {}
    if nests_deeper(arguments, MAX_ARGUMENT_DEPTH):
        arguments = {}
    return str(function.get("name")), arguments, str(call.get("id"))


def _joined(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    joined: list[dict[str, Any]] = []
    for message in messages:
        if joined and joined[-1]["role"] == message["role"] and message["role"] != "system":
            previous = joined[-1]
            joined[-1] = {**previous, "content": f"{previous['content']}\n\n{message['content']}"}
        else:
            joined.append(message)
    return joined


def _cut(text: str) -> str:
    if len(text) <= RESULT_CHARS:
        return text
    return f"{text[:RESULT_CHARS]}… [cut: {len(text) - RESULT_CHARS} more characters]"


def _text_of(content: Any) -> str:
    """A message's text: the string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _answer_of(text: str) -> str | None:
    """The answer's text when `text` is exactly `{"answer": ...}`, else None."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
        return None
    if not isinstance(value, dict) or set(value) != {_ANSWER_KEY}:
        return None
    answer = value[_ANSWER_KEY]
    if isinstance(answer, str):
        return answer
    # Too deep to write back out safely: then it is no answer, and the text is prose.
    return None if nests_deeper(answer, MAX_JSON_DEPTH) else json.dumps(answer, ensure_ascii=False)


def _names_a_tool(content: str, request: dict[str, Any]) -> bool:
    """Whether `content`, an answer, is only the name of `final_answer` or of an offered tool."""
    name = content.strip().strip("\"'`.").strip()
    offered = {_function_of(tool)["name"] for tool in request.get("tools") or []}
    return name == ANSWER_TOOL or name in offered


def _typed_answer(text: str, request: dict[str, Any], answer: _Answer) -> str | None:
    """The answer a reply to a request for JSON gives, as JSON text, when the reply is one
    JSON value (alone, or alone in a fenced block): the arguments of a `final_answer`
    call, or any JSON that is not a call of an offered tool, as written. None otherwise
    (prose, calls, calls in tags): the parser reads it."""
    body = text.strip()
    fenced = _FENCED.fullmatch(body)
    if fenced is not None:
        body = fenced[1].strip()
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if nests_deeper(value, MAX_JSON_DEPTH):
        return None
    if isinstance(value, dict) and "name" in value and "arguments" in value:
        name, arguments = value["name"], value["arguments"]
        if name == ANSWER_TOOL and isinstance(arguments, dict) and not _offers(request, name):
            return answer.text(arguments)
        if isinstance(name, str) and _offers(request, name):
            return None
    return body


def _tool_call(call: ParsedCall, call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        },
    }


def _digest(*parts: Any) -> str:
    encoded = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()
