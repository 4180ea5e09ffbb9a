"""Self-feeding: a chain of calls that feed a tool its own results.

A weak model asked for one square root may take the square root of the answer, then of
that answer, and so on: every call is new, so neither duplicate nor loop detection sees
it, and the answer it ends on means nothing. A link of such a chain is a call of the
tool of a call in the previous tool step that is that call with its result put in: each
argument is as before or is the result (a number as written, rounded or cut to the
digits the model wrote; or the whole result text), at least one being the result. A
string argument may hold the result among other text ("sqrt(4)" after "sqrt(16)" gave 4).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec

from turnkeeper.core import (
    Message,
    ToolResult,
    ToolUse,
    call_key,
    decode_arguments,
    gist,
    text_of,
    tool_uses_of,
)
from turnkeeper.guards._answer import answers_after
from turnkeeper.guards._view import CONTINUE, Directive, GuardView, Halt, Verdict, acts_in

_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_NOT_RESULTS = ('{"duplicate":true', '{"skipped":true', '{"ok":true}', '{"error"')
_BETWEEN = ("tool", "user")
_LONGEST_VALUE = 1000
_MOST_DECIMALS = 20


@acts_in("before_call", setting="self_feeding")
def self_feeding(view: GuardView) -> Verdict:
    """After a tool step, flag a chain of self-feeding calls (see the module) longer than
    `max_links` links `warnings` times, then halt. The halt's message leads with what the
    chain's first call gave: the one call of it made from the request."""
    state = view.state
    config = state.guards.self_feeding
    if view.phase != "before_call" or config is None or not view.results:
        return CONTINUE
    # Each link takes one of the episode's replies before the newest: with no more of them
    # than `max_links`, no chain can be long enough to flag.
    replies = state.polls - 1
    if replies <= config.max_links:
        return CONTINUE
    history = state.history
    if not _may_feed(history, view.results):
        return CONTINUE
    # The newest step is the view's; older ones are read from the history newest first,
    # only as far as needed: most polls stop at the first, none goes past a halt's length.
    reply = len(history) - 1
    while reply >= 0 and history[reply].get("role") in _BETWEEN:
        reply -= 1
    # The calls of the newer step that got a result: only they can take a chain on.
    fed = [use for use, result in view.results if not result.is_error]
    most = config.max_links + config.warnings + 1
    links = 0
    root: tuple[str, str] | None = None
    while fed and links < most and replies > 0:
        found = _step_before(history, reply)
        if found is None:
            break
        reply, results = found
        link = _link(history[reply], results, fed)
        if link is None:
            break
        root, links, replies = link, links + 1, replies - 1
        # Only this reply's calls can be taken further, by the step before it; its
        # arguments decode, since one of its calls just did.
        fed = [use for use in tool_uses_of(history[reply]) if use.id in results]
    if root is None or links <= config.max_links:
        return CONTINUE
    name, first = root
    lead = (
        f"I stopped because I kept feeding `{name}` its own results, which got no closer "
        "to an answer. Above is what the first call of that chain gave."
    )
    halt = Halt("self_feeding", "feeding_on_results", f"{gist(first)}\n\n{lead}")
    # As for loop detection: a stop that becomes an answer needs no warning first.
    if links <= config.max_links + config.warnings and not answers_after(state, halt):
        text = (
            f"You are feeding `{name}` its own results: each call takes the last call's "
            "answer, which gets no closer to the request. Stop doing that: answer with "
            "what you already have, or call a tool with the request's own values."
        )
        return Verdict(directives=(Directive("self_feeding", text),))
    return Verdict(halt=halt)


def _may_feed(
    history: tuple[Message, ...], results: tuple[tuple[ToolUse, ToolResult], ...]
) -> bool:
    """Whether one of the calls of `results` that got a result (not an error) might feed on
    a result of the tool step before the history's newest reply (the last message that is
    neither a tool result nor a directive), as far as one function can tell without
    decoding anything: true of every step `_link` links them to. A result may be fed on
    only as a number (which starts with "-" or a digit, or is a JSON object) or as the
    whole text of an argument.

    This runs on every poll after a tool step, and most find nothing here: one function,
    for what `_step_before`, `_link` and their helpers would otherwise each be called for,
    as a poll pays for each function it runs more than for what the function does."""
    newest = True
    for message in reversed(history):
        role = message.get("role")
        if newest:
            # The newest step's results and directives, then its reply.
            newest = role == "tool" or role == "user"
        elif role == "tool":
            content = message.get("content")
            if type(content) is not str:
                content = text_of(message)
                if content is None:
                    continue
            if content.startswith(_NOT_RESULTS):
                continue
            text = content.strip()
            if not text or len(text) > _LONGEST_VALUE:
                continue
            first = text[0]
            # isdigit holds for every digit that \d (in _NUMBER) matches.
            if first in "-{" or first.isdigit():
                return True
            for use, result in results:
                if not result.is_error:
                    for given in use.input.values():
                        if type(given) is str and given.strip() == text:
                            return True
        elif role != "user":
            return False
    return False


def _step_before(history: tuple[Message, ...], reply: int) -> tuple[int, dict[str, str]] | None:
    """The tool step before the reply at `reply`: the index of its own reply, and the
    results its calls got, by call id (errors and notices left out); None when there is
    none. The user messages between steps are directives."""
    results: dict[str, str] = {}
    for index in range(reply - 1, -1, -1):
        message = history[index]
        role = message.get("role")
        if role == "tool":
            content = message.get("content")
            if type(content) is not str:
                content = text_of(message)
            if content is not None and not content.startswith(_NOT_RESULTS):
                results[str(message.get("tool_call_id"))] = content
        elif role == "assistant":
            return (index, results) if results else None
        elif role != "user":
            return None
    return None


def _link(reply: Message, results: dict[str, str], fed: list[ToolUse]) -> tuple[str, str] | None:
    """The tool and result of a call of `reply` (which got `results`) that one of the calls
    `fed` feeds on, or None. The reply's arguments are decoded only for a call one of
    `fed` might feed on: most replies are never decoded here."""
    calls = reply.get("tool_calls")
    if not isinstance(calls, list):
        return None
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        call_id = call.get("id")
        result = results.get(call_id) if isinstance(call_id, str) else None
        if result is None:
            continue
        name = function.get("name")
        # A loop, not comprehensions: this runs on every poll after a tool step, most often
        # for one call fed, and the result is read only for a call of its tool.
        value: float | str | None = None
        takers: list[ToolUse] = []
        for use in fed:
            if use.name != name:
                continue
            if value is None:
                value = _value(result)
                if value is None:
                    break
            if _may_take(use.input, value):
                takers.append(use)
        if value is None or not takers:
            continue
        before, error = decode_arguments(function.get("arguments"))
        if error is None and any(_feeds(before, value, use.input) for use in takers):
            return str(name), result
    return None


def _may_take(arguments: dict[str, Any], value: float | str) -> bool:
    """Whether some argument could be `value` or hold it: cheap, and true of every call that
    feeds on it."""
    # Loops, not any() over a generator: this runs on every poll after a tool step.
    if isinstance(value, str):
        for given in arguments.values():
            if isinstance(given, str) and given.strip() == value:
                return True
        return False
    for given in arguments.values():
        if _is_number(given) or (isinstance(given, str) and _NUMBER.search(given) is not None):
            return True
    return False


def _value(result: str) -> float | str | None:
    """A result as one value: a finite number (written alone, or as the one value of a JSON
    object), else its text; None for a result too long to be passed on whole."""
    text = result.strip()
    if not text or len(text) > _LONGEST_VALUE:
        return None
    if _NUMBER.fullmatch(text):
        return _finite(text)
    if text.startswith("{"):
        try:
            decoded = msgspec.json.decode(text)
        except (msgspec.DecodeError, RecursionError):
            return text
        if isinstance(decoded, dict) and len(decoded) == 1:
            (only,) = decoded.values()
            if _is_number(only):
                return _finite(only)
    return text


def _feeds(before: dict[str, Any], value: float | str, after: dict[str, Any]) -> bool:
    """Whether the arguments `after` are `before` with `value` put in (see the module)."""
    if before.keys() != after.keys():
        return False
    fed = False
    for key, now in after.items():
        was = before[key]
        if (was == now and type(was) is type(now)) or _same(was, now):
            continue
        if isinstance(value, float) and _is_number(now):
            number = _finite(now)
            decimals = 0 if isinstance(now, int) else _decimals(repr(now))
            if number is None or not _written(value, number, decimals):
                return False
        elif isinstance(now, str) and isinstance(was, str):
            if not _holds(was, value, now):
                return False
        else:
            return False
        fed = True
    return fed


def _holds(was: str, value: float | str, now: str) -> bool:
    """Whether the string `now` is `was` with `value` put in: the whole string, or (for a
    number) each number in it that changed."""
    if isinstance(value, str):
        return now.strip() == value
    parts_was = _NUMBER.split(was)
    parts_now = _NUMBER.split(now)
    if len(parts_was) != len(parts_now):
        return False
    for index, (old, new) in enumerate(zip(parts_was, parts_now, strict=True)):
        if old == new:
            continue
        number = None if index % 2 == 0 else _finite(new)
        if number is None or not _written(value, number, _decimals(new)):
            return False
    return True


def _written(value: float, number: float, decimals: int) -> bool:
    """Whether `number`, written with `decimals` digits after the point, is `value` rounded
    or cut to those digits."""
    scaled = value * 10.0**decimals
    cut = math.trunc(scaled) / 10.0**decimals if math.isfinite(scaled) else value
    tolerance = 1e-9 * max(1.0, abs(number))
    return any(abs(number - candidate) <= tolerance for candidate in (round(value, decimals), cut))


def _decimals(written: str) -> int:
    """The digits after the point of a number as written."""
    try:
        exponent = Decimal(written).as_tuple().exponent
    except InvalidOperation:
        return 0
    if not isinstance(exponent, int) or exponent >= 0:
        return 0
    return min(-exponent, _MOST_DECIMALS)


def _finite(value: int | float | str) -> float | None:
    """`value` as a finite float, or None (too large, infinite or not a number)."""
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(a: object, b: object) -> bool:
    """Equal as JSON: 1 and 1.0 are, True and 1 are not."""
    if type(a) is not type(b) and not (_is_number(a) and _is_number(b)):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return call_key("", a) == call_key("", b)
    return a == b
