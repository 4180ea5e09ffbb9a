"""Guards: pure functions from a view of a poll to a verdict, and their composition."""

from turnkeeper.events._policy import (
    Budget,
    ConsecutiveErrors,
    DuplicateCalls,
    FinalTurn,
    GuardConfig,
    LoopDetection,
    MaxTurns,
    Repair,
    SmallModel,
    TerminalTool,
)
from turnkeeper.guards._builtin import (
    budget,
    consecutive_errors,
    duplicate_calls,
    final_turn,
    loop_detection,
    max_turns,
    repair,
    terminal_tool,
)
from turnkeeper.guards._compose import compose
from turnkeeper.guards._small_model import correct_reply, restate_request, resume_next_step, window
from turnkeeper.guards._view import (
    CONTINUE,
    Directive,
    Guard,
    GuardView,
    Halt,
    Phase,
    Reply,
    SelfAnswer,
    Verdict,
)

default_guards: Guard = compose(
    max_turns,
    budget,
    loop_detection,
    duplicate_calls,
    repair,
    consecutive_errors,
    resume_next_step,
    restate_request,
    correct_reply,
    terminal_tool,
    final_turn,
)
"""Every built-in guard, each configured (or turned off) by the session's GuardConfig."""

__all__ = [
    "CONTINUE",
    "Budget",
    "ConsecutiveErrors",
    "Directive",
    "DuplicateCalls",
    "FinalTurn",
    "Guard",
    "GuardConfig",
    "GuardView",
    "Halt",
    "LoopDetection",
    "MaxTurns",
    "Phase",
    "Repair",
    "Reply",
    "SelfAnswer",
    "SmallModel",
    "TerminalTool",
    "Verdict",
    "budget",
    "compose",
    "consecutive_errors",
    "correct_reply",
    "default_guards",
    "duplicate_calls",
    "final_turn",
    "loop_detection",
    "max_turns",
    "repair",
    "restate_request",
    "resume_next_step",
    "terminal_tool",
    "window",
]
