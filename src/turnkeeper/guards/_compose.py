"""Combine guards into one."""

from __future__ import annotations

from turnkeeper.core import GuardConfig
from turnkeeper.guards._view import (
    CONTINUE,
    PHASES,
    Directive,
    Guard,
    GuardView,
    Phase,
    SelfAnswer,
    Verdict,
    phases_of,
    setting_of,
)


def compose(*guards: Guard) -> Guard:
    """One guard running `guards` in order: directives and self-answers add up, and the
    first halt (or terminal-tool finish) wins and stops the rest. A guard marked with
    `acts_in` runs only in its phase."""
    by_phase = {
        phase: [(g, setting_of(g)) for g in guards if phase in phases_of(g)] for phase in PHASES
    }
    # The guards each phase runs for the last GuardConfig seen in it: most sessions of a
    # host share one, and a guard turned off costs its call on every poll otherwise.
    running: dict[Phase, tuple[GuardConfig, tuple[Guard, ...]]] = {}

    def running_in(phase: Phase, config: GuardConfig) -> tuple[Guard, ...]:
        last = running.get(phase)
        if last is not None and last[0] is config:
            return last[1]
        marked = by_phase.get(phase)
        if marked is None:
            return guards
        on = tuple(
            g for g, setting in marked if setting is None or getattr(config, setting) is not None
        )
        running[phase] = (config, on)
        return on

    def composed(view: GuardView) -> Verdict:
        # Lists only once a guard has something to say: most polls, none has.
        directives: list[Directive] | None = None
        answers: list[SelfAnswer] | None = None
        replacement: Directive | None = None
        for guard in running_in(view.phase, view.state.guards):
            verdict = guard(view)
            if verdict is CONTINUE:
                continue
            if verdict.self_answers:
                answers = [*(answers or ()), *verdict.self_answers]
            if verdict.halt is not None or verdict.finish is not None:
                return Verdict(
                    self_answers=tuple(answers or ()), halt=verdict.halt, finish=verdict.finish
                )
            if verdict.directives:
                directives = [*(directives or ()), *verdict.directives]
            replacement = replacement or verdict.replacement
        if directives is None and answers is None and replacement is None:
            return CONTINUE
        return Verdict(
            directives=tuple(directives or ()),
            self_answers=tuple(answers or ()),
            replacement=replacement,
        )

    composed.__name__ = (
        "compose(" + ", ".join(getattr(g, "__name__", "guard") for g in guards) + ")"
    )
    composed.phases = frozenset(phase for phase in PHASES if by_phase[phase])  # type: ignore[attr-defined]
    return composed
