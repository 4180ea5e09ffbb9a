"""Guard configuration: plain data, logged with each session so replay knows its policy.

The guard functions live in `turnkeeper.guards`; a field set to None turns that guard off.
"""

from __future__ import annotations

import sys

import msgspec

from turnkeeper.events._errors import InputError

FINAL_TURN_LEAD = "This is your last turn."
"""How the final-turn directive starts; backends that constrain the last reply look for it."""


def _check_count(field: str, value: object, least: int) -> None:
    """Raise InputError, naming `field`, unless `value` is an integer >= `least`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(f"{field}: expected an integer >= {least}, got {value!r:.80}")


def _check_seconds(field: str, value: object) -> None:
    """Raise InputError, naming `field`, unless `value` is a finite number of seconds > 0."""
    # NaN fails both comparisons; an int past the float range compares exactly, and is
    # refused as a float field of the log could not read it back.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= sys.float_info.max
    ):
        raise InputError(f"{field}: expected a finite number of seconds > 0, got {value!r:.80}")


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
    """Send a corrective directive when a tool has failed `threshold` (1 or more) times in a
    row."""

    threshold: int = 2

    def __post_init__(self) -> None:
        _check_count("ConsecutiveErrors.threshold", self.threshold, 1)


class LoopDetection(msgspec.Struct, frozen=True):
    """Flag a repeat (same call and answer, or the same reply text) `warnings` times (0 or
    more), then halt."""

    warnings: int = 1

    def __post_init__(self) -> None:
        _check_count("LoopDetection.warnings", self.warnings, 0)


class TerminalTool(msgspec.Struct, frozen=True):
    """With `required`, re-prompt an answer that skips the terminal tool `max_reprompts` times
    (0 or more), then halt."""

    required: bool = False
    max_reprompts: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.required, bool):
            raise InputError(
                f"TerminalTool.required: expected true or false, got {self.required!r:.80}"
            )
        _check_count("TerminalTool.max_reprompts", self.max_reprompts, 0)


class Budget(msgspec.Struct, frozen=True):
    """Per-episode limits on tokens (1 or more) and wall-clock seconds (finite, more than 0)."""

    max_tokens: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None:
            _check_count("Budget.max_tokens", self.max_tokens, 1)
        if self.max_seconds is not None:
            _check_seconds("Budget.max_seconds", self.max_seconds)


class SmallModel(msgspec.Struct, frozen=True):
    """Help for small local models (the on-device loop's steps 1, 2, 7 and 9).

    The model is sent only the last `window_turns` turns (starting on a user turn) with
    tool results cut to `max_result_chars` (both 1 or more), while the log keeps
    everything; a transcript that ends on a tool result resumes with a "next step" turn;
    after a tool step the request is restated; and, once per step, a plain reply that
    ignores the last failed call, or tells the user to use a tool that is right here, is
    sent back.
    """

    window_turns: int = 12
    max_result_chars: int = 1500

    def __post_init__(self) -> None:
        _check_count("SmallModel.window_turns", self.window_turns, 1)
        _check_count("SmallModel.max_result_chars", self.max_result_chars, 1)


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

    def __post_init__(self) -> None:
        for name, kind in _GUARD_KINDS.items():
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise InputError(
                    f"GuardConfig.{name}: expected a {kind.__name__} or None, "
                    f"got {type(value).__name__}"
                )


_GUARD_KINDS: dict[str, type] = {
    "max_turns": MaxTurns,
    "final_turn": FinalTurn,
    "duplicates": DuplicateCalls,
    "repair": Repair,
    "consecutive_errors": ConsecutiveErrors,
    "loop": LoopDetection,
    "terminal": TerminalTool,
    "budget": Budget,
    "small_model": SmallModel,
}
