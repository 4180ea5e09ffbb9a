"""Compaction's pure half: which older turns of a history a summary would replace, the
request that asks the model for it, and the events of its outcome.

The driver (`_driver.py`) is the shell: it estimates the history's tokens with the chat
backend, decides, makes the summary call, and hands the outcome here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

from turnkeeper.core import ChatError, Message, degenerate, gist, text_of
from turnkeeper.events import AnyEvent, Compacted, CompactionFailed, Envelope
from turnkeeper.sessions._poll import _as_logged, _Log, _storable, check_response, priced
from turnkeeper.state import SessionState

SUMMARY_LEAD = "Summary of the conversation so far: "
"""How the message a summary takes the place of older turns with begins."""

SUMMARY_SYSTEM = (
    "You write short summaries of conversations between a user and an assistant that uses tools."
)
SUMMARY_ASK = (
    "Summarize the conversation above in a few sentences, for the assistant to go on "
    "from: what the user asked, the facts and numbers the tools returned, what was "
    "answered, and what is still to do."
)
"""What the summary request asks, after the transcript, which it quotes. Measured on
SmolLM2-135M summarising 2, 4, 6 and 8 sums with facts of a trip (tokens greedy): given
the transcript unquoted, it went on writing it from 4 sums up (one line over and over at
6 and 8); quoted, it wrote prose each time, naming the sums, and at 6 and 8 the trip."""
_LINE_CHARS = 600
"""Longest line of the transcript a summary is asked of (a message, a call, a result)."""


class Plan(msgspec.Struct, frozen=True, gc=False):
    """A compaction decided on: the summary of `history`'s messages from `start` up to
    `end` (but those at `kept`), asked for by `request`; `estimated` is the history's
    tokens, past `budget`."""

    history: tuple[Message, ...]
    start: int
    end: int
    kept: tuple[int, ...]
    estimated: int
    budget: int
    request: dict[str, Any]

    def older(self) -> list[Message]:
        """The messages the summary is to replace."""
        kept = self.kept
        return [
            message
            for index, message in enumerate(self.history[self.start : self.end], self.start)
            if index not in kept
        ]


def older_turns(state: SessionState, keep_recent_turns: int) -> tuple[int, int, tuple[int, ...]]:
    """`(start, end, kept)`: the history's messages a summary would replace, from `start`
    (after the system message) up to `end` (where the last `keep_recent_turns` turns
    begin), but for `kept`, the current request's message if it is among them. A turn
    begins at each message that is not a tool result: a tool call is never parted from
    its results. `start == end` when there are no older turns."""
    history = state.history
    start = 1 if history and history[0].get("role") == "system" else 0
    begins = [i for i in range(start, len(history)) if history[i].get("role") != "tool"]
    if len(begins) <= keep_recent_turns:
        return start, start, ()
    end = begins[-keep_recent_turns]
    request = _request_index(state, end)
    kept = (request,) if request is not None and request >= start else ()
    return start, end, kept


def _request_index(state: SessionState, before: int) -> int | None:
    """The index of the current request's user message in the history, if it is before
    `before` (the last such message: its text may have been sent before)."""
    request = state.request
    if request is None:
        return None
    history = state.history
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message.get("role") == "user" and text_of(message) == request:
            return index if index < before else None
    return None


class Transcript(msgspec.Struct, frozen=True, gc=False):
    """The older messages as lines of a transcript; those at `pinned` (an earlier summary,
    the current request) are never left out."""

    lines: tuple[str, ...]
    pinned: frozenset[int]

    @property
    def droppable(self) -> int:
        """How many lines may be left out: all but the pinned ones and the last."""
        return max(len(self.lines) - len(self.pinned | {len(self.lines) - 1}), 0)

    def text(self, dropped: int) -> str:
        """The transcript with its `dropped` oldest lines left out (but the pinned ones),
        saying so where they were."""
        lines: list[str] = []
        left = dropped
        for index, line in enumerate(self.lines):
            if left and index not in self.pinned:
                if left == dropped:
                    lines.append(f"({dropped} earlier lines left out)")
                left -= 1
                continue
            lines.append(line)
        return "\n".join(lines)


def transcript(messages: list[Message], kept: frozenset[int]) -> Transcript:
    """The messages as lines: what each said, each call made, each result, each cut to
    `_LINE_CHARS`; an earlier summary whole (it is no longer than its summary tokens). The
    lines of an earlier summary and of the messages at `kept` (positions in `messages`)
    are pinned."""
    names: dict[str, str] = {}
    lines: list[str] = []
    pinned: set[int] = set()
    for position, message in enumerate(messages):
        role = message.get("role")
        text = text_of(message) or ""
        if role == "assistant":
            if text.strip():
                lines.append(gist(f"Assistant: {text}", _LINE_CHARS))
            for call_id, name, arguments in _calls(message):
                names[call_id] = name
                lines.append(gist(f"Assistant called {name}({arguments})", _LINE_CHARS))
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id")), "a tool")
            lines.append(gist(f"Result of {name}: {text}", _LINE_CHARS))
        elif role == "user" and text.startswith(SUMMARY_LEAD):
            pinned.add(len(lines))
            lines.append(" ".join(f"Earlier: {text[len(SUMMARY_LEAD) :]}".split()))
        else:
            if position in kept:
                pinned.add(len(lines))
            lines.append(gist(f"{str(role).capitalize()}: {text}", _LINE_CHARS))
    return Transcript(tuple(lines), frozenset(pinned))


def summary_request(state: SessionState, text: str) -> dict[str, Any]:
    """The request asking the model for a summary of the transcript `text`, with no tools;
    the spec's sampling params, but for `max_tokens`, which is the compaction's
    `summary_tokens`."""
    compaction = state.spec.compaction
    assert compaction is not None
    request: dict[str, Any] = {
        "model": state.spec.model,
        "messages": [
            {"role": "system", "content": SUMMARY_SYSTEM},
            {"role": "user", "content": f'The conversation:\n\n"""\n{text}\n"""\n\n{SUMMARY_ASK}'},
        ],
        "tools": [],
    }
    request.update(state.spec.sampling())
    request["max_tokens"] = compaction.summary_tokens
    return request


def _calls(message: Message) -> list[tuple[str, str, str]]:
    """The (id, name, arguments) of an assistant message's tool calls, as given."""
    calls = message.get("tool_calls")
    found: list[tuple[str, str, str]] = []
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            found.append(
                (
                    str(call.get("id")),
                    str(function.get("name")),
                    arguments if isinstance(arguments, str) else "",
                )
            )
    return found


def _whole_sentences(text: str) -> str:
    """`text`, cut off by the token limit, without its last sentence if that one is cut
    short (when whole ones come before it): measured on SmolLM2-135M, a summary ending
    "The user then asked what is 100 plus" had it answer that instead of the request."""
    ends = [found.end() for found in _SENTENCE_END.finditer(text)]
    return text[: ends[-1]].rstrip() if ends else text


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def compaction_events(
    plan: Plan,
    state: SessionState,
    response: object,
    failure: ChatError | None,
    reported: Iterable[AnyEvent],
    *,
    now: float,
) -> tuple[list[Envelope], SessionState]:
    """The events of the summary call's outcome after `state` (what the backend reported,
    then `local.compacted`, or `local.compaction_failed` when the call failed, its response
    is malformed, or its summary is empty or one phrase repeated), and the state they
    lead to."""
    log = _Log(state)
    for event in reported:
        log.push(event, now)

    def failed(error: str, **fields: Any) -> tuple[list[Envelope], SessionState]:
        log.push(
            CompactionFailed(error=error, estimated=plan.estimated, budget=plan.budget, **fields),
            now,
        )
        return log.events, log.state

    if state.history is not plan.history:
        # Only messages queued may be logged during the call, and they leave the history.
        return failed("the history changed during the summary call", response=_storable(response))
    if failure is not None:
        return failed(failure.message, transient=failure.transient, status=failure.status)
    try:
        answered, logged = _as_logged(response)
        message, finish_reason, usage = check_response(
            answered, call_prefix=f"summary_{state.seq + 1}"
        )
    except ChatError as error:
        return failed(error.message, response=_storable(response))
    usage = priced(usage, state.spec)
    summary = (text_of(message) or "").strip()
    if finish_reason == "length":
        summary = _whole_sentences(summary)
    if not summary:
        return failed("the summary was empty", usage=usage, response=answered)
    if degenerate(summary):
        return failed("the summary repeats one phrase", usage=usage, response=answered)
    log.push(
        Compacted(
            start=plan.start,
            end=plan.end,
            kept=plan.kept,
            message={"role": "user", "content": SUMMARY_LEAD + summary},
            estimated=plan.estimated,
            budget=plan.budget,
            response=logged,
            usage=usage,
        ),
        now,
    )
    return log.events, log.state
