"""Combine guards into one."""

from __future__ import annotations

from turnkeeper.guards._view import (
    CONTINUE,
    PHASES,
    Directive,
    Guard,
    GuardView,
    SelfAnswer,
    Verdict,
    phases_of,
)


def compose(*guards: Guard) -> Guard:
    """One guard running `guards` in order: directives and self-answers add up, and the
    first halt (or terminal-tool finish) wins and stops the rest. A guard marked with
    `acts_in` runs only in its phase."""
    by_phase = {phase: [g for g in guards if phase in phases_of(g)] for phase in PHASES}

    def composed(view: GuardView) -> Verdict:
        # Lists only once a guard has something to say: most polls, none has.
        directives: list[Directive] | None = None
        answers: list[SelfAnswer] | None = None
        replacement: Directive | None = None
        for guard in by_phase.get(view.phase, guards):
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
