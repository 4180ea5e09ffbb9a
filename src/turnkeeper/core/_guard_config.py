"""Guard configuration: plain data, logged with each session so replay knows its policy.

The guard functions live in `turnkeeper.guards`; a field set to None turns that guard off.
`check_guards` bounds the settings of a new session's configuration; decoding does not,
so a log written before a bound was set still reads.
"""

from __future__ import annotations

import msgspec

from turnkeeper.core._checks import check_count, check_seconds
from turnkeeper.core._errors import InputError
from turnkeeper.core._pricing import check_limit

FINAL_TURN_LEAD = "This is your last turn."
"""How the final-turn directive starts; backends that constrain the last reply look for it."""


class MaxTurns(msgspec.Struct, frozen=True):
    """Halt an episode that would make more model calls than the session's `max_turns`.
    With `answer` (the default), an episode that has tool results makes its last allowed
    poll with tools withdrawn, asked to answer from those results: that reply ends it."""

    answer: bool = True


class FinalTurn(msgspec.Struct, frozen=True):
    """Tell the model to finish now on the last poll `max_turns` allows."""


class DuplicateCalls(msgspec.Struct, frozen=True):
    """Self-answer an exact repeat of (name, args) within an episode instead of running it."""


class Repair(msgspec.Struct, frozen=True):
    """A bad reply goes back to the model once: bad calls (an unknown tool, unreadable or
    invalid arguments) as tool errors, and a reply without calls that is not an answer
    (unreadable, cut off by the token limit, or one phrase repeated) with a directive to
    reply again. A second bad reply in a row ends the run with an apology, or with
    `answer` (the default), when the episode has tool results, with one last call with
    tools withdrawn, asked to answer from them."""

    answer: bool = True


class ConsecutiveErrors(msgspec.Struct, frozen=True):
    """Send a corrective directive when a tool has failed `threshold` (1 or more) times in a
    row."""

    threshold: int = 2


class LoopDetection(msgspec.Struct, frozen=True):
    """Flag a repeat (same call and answer, or the same reply text) `warnings` times (0 or
    more), then halt; with `answer` (the default), when the episode has tool results, the
    halt is one last call with tools withdrawn, asked to answer from them."""

    warnings: int = 1
    answer: bool = True


class SelfFeeding(msgspec.Struct, frozen=True):
    """Flag a chain of calls that feed a tool its own results (each call the previous one
    with that call's result put in; a square root of the last square root, say) once it
    is longer than `max_links` (1 or more) links, `warnings` times (0 or more), then halt;
    with `answer` (the default), the halt is one last call with tools withdrawn, asked to
    answer from the results the episode has.
    """

    max_links: int = 2
    warnings: int = 1
    answer: bool = True


class TerminalTool(msgspec.Struct, frozen=True):
    """With `required`, re-prompt an answer that skips the terminal tool `max_reprompts` times
    (0 or more), then halt; with `answer` (the default), when the episode has tool
    results, the halt is one last call with tools withdrawn, asked to answer from them."""

    required: bool = False
    max_reprompts: int = 2
    answer: bool = True


class TypedOutput(msgspec.Struct, frozen=True):
    """For a spec with an `output_schema`: send an answer that does not match it back to the
    model, saying what is wrong, `max_reprompts` times (0 or more) in an episode, then halt
    (`invalid_output`). Off (None), the first such answer ends the episode."""

    max_reprompts: int = 2


class Budget(msgspec.Struct, frozen=True):
    """Per-episode limits on tokens (1 or more) and wall-clock seconds (finite, more than 0).
    With `answer` (the default), a spent budget still allows one last call with tools
    withdrawn, asked to answer from the episode's tool results, when it has any."""

    max_tokens: int | None = None
    max_seconds: float | None = None
    answer: bool = True


class CostBudget(msgspec.Struct, frozen=True):
    """Limits on what the model calls cost, by the spec's `pricing` (a session without one
    is never stopped by it): `max_cost` per episode, `max_session_cost` over the session's
    life (numbers over 0 to 1e15, in the pricing's currency), compared exactly with the logged
    costs.
    With `answer` (the default), a spent budget still allows one last call with tools
    withdrawn, asked to answer from the episode's tool results, when it has any."""

    max_cost: float | None = None
    max_session_cost: float | None = None
    answer: bool = True


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


class GuardConfig(msgspec.Struct, frozen=True):
    """Which guards run for a session, and how. The defaults reproduce both reference loops."""

    max_turns: MaxTurns | None = MaxTurns()
    final_turn: FinalTurn | None = FinalTurn()
    duplicates: DuplicateCalls | None = DuplicateCalls()
    repair: Repair | None = Repair()
    consecutive_errors: ConsecutiveErrors | None = ConsecutiveErrors()
    loop: LoopDetection | None = LoopDetection()
    self_feeding: SelfFeeding | None = SelfFeeding()
    terminal: TerminalTool | None = TerminalTool()
    budget: Budget | None = None
    small_model: SmallModel | None = None
    cost: CostBudget | None = None
    output: TypedOutput | None = TypedOutput()


_GUARD_KINDS: dict[str, type] = {
    "max_turns": MaxTurns,
    "final_turn": FinalTurn,
    "duplicates": DuplicateCalls,
    "repair": Repair,
    "consecutive_errors": ConsecutiveErrors,
    "loop": LoopDetection,
    "self_feeding": SelfFeeding,
    "terminal": TerminalTool,
    "budget": Budget,
    "small_model": SmallModel,
    "cost": CostBudget,
    "output": TypedOutput,
}


def check_guards(config: GuardConfig, *, since: GuardConfig | None = None) -> None:
    """Raise InputError, naming the field as `guards.<guard>.<setting>`, unless each guard
    of `config` is None or of its own kind with every setting in range. With `since` (the
    configuration a log holds), a guard set as there is not checked: what was logged
    stands."""
    if not isinstance(config, GuardConfig):
        raise InputError(f"guards: expected a GuardConfig, got {type(config).__name__}")
    for name, kind in _GUARD_KINDS.items():
        value = getattr(config, name)
        if since is not None and value == getattr(since, name):
            continue
        if value is None:
            continue
        if not isinstance(value, kind):
            raise InputError(
                f"guards.{name}: expected a {kind.__name__} or None, got {type(value).__name__}"
            )
        field = f"guards.{name}"
        answer = getattr(value, "answer", False)
        if not isinstance(answer, bool):
            raise InputError(f"{field}.answer: expected true or false, got {answer!r:.80}")
        if isinstance(value, ConsecutiveErrors):
            check_count(f"{field}.threshold", value.threshold, 1)
        elif isinstance(value, LoopDetection):
            check_count(f"{field}.warnings", value.warnings, 0)
        elif isinstance(value, SelfFeeding):
            check_count(f"{field}.max_links", value.max_links, 1)
            check_count(f"{field}.warnings", value.warnings, 0)
        elif isinstance(value, TerminalTool):
            if not isinstance(value.required, bool):
                raise InputError(
                    f"{field}.required: expected true or false, got {value.required!r:.80}"
                )
            check_count(f"{field}.max_reprompts", value.max_reprompts, 0)
        elif isinstance(value, Budget):
            if value.max_tokens is not None:
                check_count(f"{field}.max_tokens", value.max_tokens, 1)
            if value.max_seconds is not None:
                check_seconds(f"{field}.max_seconds", value.max_seconds, positive=True)
        elif isinstance(value, CostBudget):
            for limit in ("max_cost", "max_session_cost"):
                if getattr(value, limit) is not None:
                    check_limit(getattr(value, limit), f"{field}.{limit}")
        elif isinstance(value, TypedOutput):
            check_count(f"{field}.max_reprompts", value.max_reprompts, 0)
        elif isinstance(value, SmallModel):
            check_count(f"{field}.window_turns", value.window_turns, 1)
            check_count(f"{field}.max_result_chars", value.max_result_chars, 1)
