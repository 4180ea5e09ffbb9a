"""normalize: what one poll's events mean for the caller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from turnkeeper.core import ToolUse, Usage, text_of, tool_uses_of
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Halted,
    ModelResponded,
    OutputAccepted,
    ReplyReplaced,
    TerminalToolCalled,
)

Terminal = Literal["requires_action", "end_turn", "terminated"]


class TurnResult(msgspec.Struct, frozen=True):
    """One poll's outcome.

    requires_action: run `tool_uses` (possibly none) and resume. end_turn: the model
    answered (`stop_reason` "end_turn") or called the terminal tool ("terminal_tool",
    with its arguments in `result`). terminated: a guard halted the episode or the
    model stopped for another reason (`stop_reason` says which). `problems` lists tool
    calls whose arguments were not a JSON object (their input is `{}`). `answered_after`
    names the stop a guard turned into this answer, as `guard (reason)`; a poll that
    asks for such an answer is `requires_action` with no tool uses (resume to make it).
    `output` is an answer's typed output (the JSON value `local.output` holds), with
    `typed` true; None and false when the spec has no `output_schema`.
    """

    terminal: Terminal
    stop_reason: str
    text: str | None
    tool_uses: tuple[ToolUse, ...]
    usage: Usage
    events: tuple[Envelope, ...]
    result: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()
    answered_after: str | None = None
    output: Any = None
    typed: bool = False


def normalize(events: Sequence[Envelope]) -> TurnResult:
    """Read one poll's events (as poll_turn returned them) into a TurnResult."""
    response: ModelResponded | None = None
    duplicates: set[str] = set()
    halted: Halted | None = None
    finished: TerminalToolCalled | None = None
    directed_after = False
    replaced: str | None = None
    asked = False
    answered: AnsweredAfterStop | None = None
    output: OutputAccepted | None = None
    for envelope in events:
        event = envelope.event
        if isinstance(event, ModelResponded):
            response, asked = event, False
        elif isinstance(event, DuplicateToolCall):
            duplicates.add(event.tool_call_id)
        elif isinstance(event, Halted):
            halted = event
        elif isinstance(event, TerminalToolCalled):
            finished = event
        elif isinstance(event, DirectiveInjected) and response is not None:
            directed_after = True
        elif isinstance(event, ReplyReplaced):
            replaced = event.text
        elif isinstance(event, AnswerRequested):
            asked = True
        elif isinstance(event, AnsweredAfterStop):
            answered = event
        elif isinstance(event, OutputAccepted):
            output = event
    frozen = tuple(events)
    value = None if output is None else output.value
    usage = response.usage if response is not None else Usage()
    if halted is not None:
        return TurnResult("terminated", halted.reason, halted.message, (), usage, frozen)
    if asked:
        return TurnResult("requires_action", "tool_use", None, (), usage, frozen)
    if answered is not None and response is not None:
        after = f"{answered.guard} ({answered.reason})"
        text = text_of(response.message)
        return TurnResult(
            "end_turn",
            "end_turn",
            text,
            (),
            usage,
            frozen,
            answered_after=after,
            output=value,
            typed=output is not None,
        )
    if response is None:
        return TurnResult("terminated", "no_response", None, (), usage, frozen)
    text = text_of(response.message)
    calls = tool_uses_of(response.message)
    if finished is not None:
        return TurnResult(
            "end_turn", "terminal_tool", text, (), usage, frozen, result=finished.result
        )
    fresh = tuple(call for call in calls if call.id not in duplicates)
    problems = tuple(f"{call.name} ({call.id}): {call.error}" for call in fresh if call.error)
    if calls or directed_after:
        return TurnResult("requires_action", "tool_use", text, fresh, usage, frozen, None, problems)
    if response.finish_reason == "stop":
        return TurnResult(
            "end_turn",
            "end_turn",
            replaced or text,
            (),
            usage,
            frozen,
            output=value,
            typed=output is not None,
        )
    return TurnResult("terminated", response.finish_reason or "unknown", text, (), usage, frozen)
