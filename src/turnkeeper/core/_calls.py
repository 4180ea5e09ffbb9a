"""Whether a tool call may run, and whether a reply is usable at all: the checks shared by
the runners, the repair guard and the fold."""

from __future__ import annotations

import operator
import re
from typing import Any

import msgspec

from turnkeeper.core._jsonschema import coerce, is_valid, validate
from turnkeeper.core._types import AgentSpec, ToolUse

# Each answer with its spec: held here, a spec's id cannot pass to another spec while its
# answers are remembered.
_checked: dict[tuple[int, str, str], tuple[AgentSpec, ToolUse, str | None]] = {}


def call_problem(spec: AgentSpec, use: ToolUse) -> str | None:
    """Why `use` must not run (unreadable or invalid arguments, an unknown tool), as the tool
    error the model is sent, or None. Arguments are checked as the handler would get them,
    after the safe coercions of `coerce` (so `"3"` for an integer is not refused).

    A call is checked before it runs and again by the repair guard after the next reply,
    so the last few thousand answers are remembered."""
    key = (id(spec), use.id, use.name)
    known = _checked.get(key)
    if known is not None and known[0] is spec and known[1] == use:
        return known[2]
    problem = _call_problem(spec, use)
    if len(_checked) >= 4096:
        _checked.clear()
    _checked[key] = (spec, use, problem)
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


_TAIL_WORDS = 1000
_MAX_PHRASE = 32
_MIN_REPEATS = 5
_MIN_SPAN = 15
_TAIL_CHARS = 2000
_MIN_RUN_CHARS = 40
# A string of 2 to 16 characters (no spaces) written 8 or more times in a row: a model
# stuck inside one word ("final_a_n_s_f_l_a_n_s_f_l...") repeats no whole word.
_REPEATED_STRING = re.compile(r"(\S{2,16}?)\1{7,}")


def reply_flaw(text: str | None, finish_reason: str | None) -> str | None:
    """What makes a reply without tool calls unusable as an answer (cut off by the token
    limit, or one phrase repeated over and over), or None."""
    if finish_reason == "length":
        return "it was cut off by the token limit"
    if text and degenerate(text):
        return "it repeats one phrase over and over"
    return None


def degenerate(text: str) -> bool:
    """Whether `text` is mostly one phrase (of up to 32 words) repeated 5 or more times in a
    row, spanning 15 words or more and half the text, or mostly one string of up to 16
    characters written 8 or more times in a row without a space, spanning 40 characters or
    more and half the text. Only the end is read (1000 words, 2000 characters): a model
    stuck in a repetition stays stuck to the end of its reply."""
    return _repeats_a_phrase(text) or _repeats_a_string(text)


def _repeats_a_string(text: str) -> bool:
    tail = text[-_TAIL_CHARS:].strip()
    for match in _REPEATED_STRING.finditer(tail):
        span = match.end() - match.start()
        if span >= _MIN_RUN_CHARS and 2 * span >= len(tail):
            return True
    return False


def _repeats_a_phrase(text: str) -> bool:
    words = text.split()[-_TAIL_WORDS:]
    count = len(words)
    if count < _MIN_SPAN:
        return False
    need = max(_MIN_SPAN, (count + 1) // 2)
    # A repetition spanning `need` words holds at most a fifth of them, and at most
    # _MAX_PHRASE, as distinct words: most prose has too many to be one.
    if len(set(words)) > count - need + min(need // _MIN_REPEATS, _MAX_PHRASE):
        return False
    for phrase in range(1, min(_MAX_PHRASE, count // _MIN_REPEATS) + 1):
        # A phrase repeated k times in a row is a run of (k - 1) * phrase words each equal
        # to the word `phrase` places before it; the longest run is at most all of them.
        least = max(need, _MIN_REPEATS * phrase) - phrase
        if sum(map(operator.eq, words[phrase:], words)) < least:
            continue
        run = longest = 0
        for index in range(phrase, count):
            if words[index] == words[index - phrase]:
                run += 1
                longest = max(longest, run)
            else:
                run = 0
        if longest >= least:
            return True
    return False
