"""The cost budget: a halt before a model call once the calls have cost what is allowed."""

from __future__ import annotations

from decimal import Decimal

from turnkeeper.core import as_decimal
from turnkeeper.guards._builtin import with_last_result
from turnkeeper.guards._view import CONTINUE, GuardView, Halt, Verdict, acts_in


@acts_in("before_call", setting="cost")
def cost_budget(view: GuardView) -> Verdict:
    """Halt before a model call once the episode's calls have cost `max_cost` or more, or
    the session's `max_session_cost` or more (both compared exactly with the costs its
    usage sums, from the logged usage and prices). A session without pricing is never
    halted by it: its cost is not known."""
    state = view.state
    config = state.guards.cost
    if view.phase != "before_call" or config is None or state.spec.pricing is None:
        return CONTINUE
    for limit, spent, what in (
        (config.max_cost, state.episode_usage.cost, "this request"),
        (config.max_session_cost, state.usage.cost, "this session"),
    ):
        if limit is None:
            continue
        allowed = as_decimal(limit)
        used = spent if spent is not None else Decimal(0)
        if used >= allowed:
            lead = f"I stopped: {what} has cost {used}, its budget is {allowed}."
            return Verdict(halt=Halt("cost", "cost_exceeded", with_last_result(state, lead)))
    return CONTINUE
