"""Whether a tool call may run: the one check shared by the runners, the repair guard and
the fold."""

from __future__ import annotations

from typing import Any

import msgspec

from turnkeeper.core._jsonschema import coerce, is_valid, validate
from turnkeeper.core._types import AgentSpec, ToolUse

_checked: dict[tuple[int, str, str], tuple[ToolUse, str | None]] = {}


def call_problem(spec: AgentSpec, use: ToolUse) -> str | None:
    """Why `use` must not run (unreadable or invalid arguments, an unknown tool), as the tool
    error the model is sent, or None. Arguments are checked as the handler would get them,
    after the safe coercions of `coerce` (so `"3"` for an integer is not refused).

    A call is checked before it runs and again by the repair guard after the next reply,
    so the last few thousand answers are remembered."""
    key = (id(spec), use.id, use.name)
    known = _checked.get(key)
    if known is not None and known[0] == use:
        return known[1]
    problem = _call_problem(spec, use)
    if len(_checked) >= 4096:
        _checked.clear()
    _checked[key] = (use, problem)
    return problem


def _call_problem(spec: AgentSpec, use: ToolUse) -> str | None:
    if use.error is not None:
        problem = f"{use.error}. Call {use.name} again with a JSON object as its arguments."
    elif not spec.tools:
        return None
    elif (tool := spec.tool(use.name)) is None:
        known = ", ".join(t.name for t in spec.tools)
        problem = f"unknown tool {use.name!r}. The tools are: {known}."
    elif is_valid(tool.input_schema, use.input):
        return None
    else:
        errors = validate(tool.input_schema, coerce(tool.input_schema, use.input))
        if not errors:
            return None
        problem = f"invalid arguments for {use.name}: {'; '.join(errors)}."
    return f"Error: {problem} Try again."


def is_unreadable(response: dict[str, Any]) -> bool:
    """Whether a backend flagged the reply as an attempted tool call it could not read."""
    return _flags_unreadable(response.get("turnkeeper"))


class _Marks(msgspec.Struct):
    """The one part of a logged response that a replay reads: turnkeeper's own marks."""

    turnkeeper: Any = None


_marks_of = msgspec.json.Decoder(_Marks).decode


def logged_unreadable(response: msgspec.Raw) -> bool:
    """`is_unreadable` of a logged response (encoded JSON), decoding its `turnkeeper` key
    alone; a response that is not a JSON object is not flagged."""
    try:
        marks = _marks_of(response).turnkeeper
    except msgspec.ValidationError:
        return False
    return _flags_unreadable(marks)


def _flags_unreadable(marks: object) -> bool:
    return isinstance(marks, dict) and marks.get("unreadable") is True


def reply_problem(spec: AgentSpec, uses: tuple[ToolUse, ...], unreadable: bool) -> str | None:
    """What makes a reply bad (an unreadable call, or a call that must not run), or None."""
    if unreadable:
        return "the reply is neither a readable tool call nor an answer"
    for use in uses:
        problem = call_problem(spec, use)
        if problem is not None:
            return problem.removeprefix("Error: ").removesuffix(" Try again.")
    return None
