"""What a guard sees (GuardView) and what it answers (Verdict)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from turnkeeper.core import Message, ToolResult, ToolUse, Usage
from turnkeeper.events import Counts
from turnkeeper.state import SessionState

Phase = Literal["before_call", "after_response"]


class Reply(msgspec.Struct, frozen=True):
    """The model's answer in this poll, as guards see it after the call."""

    message: Message
    text: str | None
    calls: tuple[ToolUse, ...]
    finish_reason: str | None
    usage: Usage
    unreadable: bool = False


class GuardView(msgspec.Struct, frozen=True):
    """A read-only view of one point in a poll.

    before_call: `state` has the poll's input applied and `results` holds the tool
    results it delivered. after_response: `state` is as it was before the reply,
    and `reply` is the model's answer.
    """

    phase: Phase
    state: SessionState
    now: float
    results: tuple[tuple[ToolUse, ToolResult], ...] = ()
    reply: Reply | None = None


class Directive(msgspec.Struct, frozen=True):
    """A user directive a guard adds to the history; `counts` is what it counts in the
    session's state (see `DirectiveInjected`), None for nothing."""

    guard: str
    text: str
    counts: Counts | None = None


class SelfAnswer(msgspec.Struct, frozen=True):
    """A tool call answered by a guard instead of being run."""

    tool_call_id: str
    name: str
    arguments: str
    message: str


class Halt(msgspec.Struct, frozen=True):
    """Stop the episode; `message` is what the user is told."""

    guard: str
    reason: str
    message: str


class Verdict(msgspec.Struct, frozen=True):
    """A guard's answer: add directives or self-answers, halt, finish with the terminal tool,
    or (after a plain answer) replace the answer with another text."""

    directives: tuple[Directive, ...] = ()
    self_answers: tuple[SelfAnswer, ...] = ()
    halt: Halt | None = None
    finish: ToolUse | None = None
    replacement: Directive | None = None


CONTINUE = Verdict()
"""The verdict that changes nothing."""

Guard = Callable[[GuardView], Verdict]
"""A pure function from a view to a verdict."""

PHASES: frozenset[Phase] = frozenset(("before_call", "after_response"))


def acts_in(phase: Phase, *, setting: str | None = None) -> Callable[[Guard], Guard]:
    """Mark a guard as answering CONTINUE in every other phase and, with `setting` (a field
    of GuardConfig), whenever the session's GuardConfig has that field None: `compose`
    skips it there."""

    def mark(guard: Guard) -> Guard:
        guard.phases = frozenset((phase,))  # type: ignore[attr-defined]
        guard.setting = setting  # type: ignore[attr-defined]
        return guard

    return mark


def phases_of(guard: Guard) -> frozenset[Phase]:
    """The phases a guard acts in (every phase unless it was marked with `acts_in`)."""
    phases: frozenset[Phase] = getattr(guard, "phases", PHASES)
    return phases


def setting_of(guard: Guard) -> str | None:
    """The GuardConfig field whose None turns the guard off (see `acts_in`), if any."""
    setting: str | None = getattr(guard, "setting", None)
    return setting
