"""Guard configuration: plain data, logged with each session so replay knows its policy.

The guard functions live in `turnkeeper.guards`; a field set to None turns that guard off.
"""

from __future__ import annotations

import msgspec

FINAL_TURN_LEAD = "This is your last turn."
"""How the final-turn directive starts; backends that constrain the last reply look for it."""


class MaxTurns(msgspec.Struct, frozen=True):
    """Halt an episode that would make more model calls than the session's `max_turns`."""


class FinalTurn(msgspec.Struct, frozen=True):
    """Tell the model to finish now on the last poll `max_turns` allows."""


class DuplicateCalls(msgspec.Struct, frozen=True):
    """Self-answer an exact repeat of (name, args) within an episode instead of running it."""


class Repair(msgspec.Struct, frozen=True):
    """A bad reply (an unknown tool, unreadable or invalid arguments) goes back to the model
    as a tool error, once: a second bad reply in a row ends the run with an apology."""


class ConsecutiveErrors(msgspec.Struct, frozen=True):
    """Send a corrective directive when a tool has failed `threshold` times in a row."""

    threshold: int = 2


class LoopDetection(msgspec.Struct, frozen=True):
    """Flag a repeat (same call and answer, or the same reply text) `warnings` times, then halt."""

    warnings: int = 1


class TerminalTool(msgspec.Struct, frozen=True):
    """With `required`, re-prompt an answer that skips the terminal tool, then halt."""

    required: bool = False
    max_reprompts: int = 2


class Budget(msgspec.Struct, frozen=True):
    """Per-episode limits on tokens and wall-clock seconds."""

    max_tokens: int | None = None
    max_seconds: float | None = None


class SmallModel(msgspec.Struct, frozen=True):
    """Help for small local models (the on-device loop's steps 1, 2, 7 and 9).

    The model is sent only the last `window_turns` turns (starting on a user turn) with
    tool results cut to `max_result_chars`, while the log keeps everything; a transcript
    that ends on a tool result resumes with a "next step" turn; after a tool step the
    request is restated; and, once per step, a plain reply that ignores the last failed
    call, or tells the user to use a tool that is right here, is sent back.
    """

    window_turns: int = 12
    max_result_chars: int = 1500


class GuardConfig(msgspec.Struct, frozen=True):
    """Which guards run for a session, and how. The defaults reproduce both reference loops."""

    max_turns: MaxTurns | None = MaxTurns()
    final_turn: FinalTurn | None = FinalTurn()
    duplicates: DuplicateCalls | None = DuplicateCalls()
    repair: Repair | None = Repair()
    consecutive_errors: ConsecutiveErrors | None = ConsecutiveErrors()
    loop: LoopDetection | None = LoopDetection()
    terminal: TerminalTool | None = TerminalTool()
    budget: Budget | None = None
    small_model: SmallModel | None = None
