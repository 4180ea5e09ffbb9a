"""The cost budget guard, called directly as the pure function it is, at and around its
limits; and the checks of its settings."""

from __future__ import annotations

from decimal import Decimal

import msgspec
import pytest

from turnkeeper.core import AgentSpec, InputError, Pricing, Usage, check_guards
from turnkeeper.guards import CONTINUE, CostBudget, GuardConfig, GuardView, cost_budget
from turnkeeper.sessions import open_session
from turnkeeper.state import SessionState

PRICED = AgentSpec(pricing=Pricing(0.15, 0.6))


def state(
    spec: AgentSpec = PRICED, *, session: str | None = None, episode: str | None = None
) -> SessionState:
    guards = GuardConfig(cost=CostBudget(max_cost=0.01, max_session_cost=0.05))
    opened = open_session(spec, session_id="s", guards=guards)
    return msgspec.structs.replace(
        opened,
        usage=Usage(cost=None if session is None else Decimal(session)),
        episode_usage=Usage(cost=None if episode is None else Decimal(episode)),
    )


def verdict_of(of: SessionState, phase: str = "before_call") -> object:
    return cost_budget(GuardView(phase, of, 0.0))  # type: ignore[arg-type]


def test_it_halts_once_the_episode_has_cost_its_budget_exactly() -> None:
    assert verdict_of(state(session="0.0099999999", episode="0.0099999999")) is CONTINUE
    verdict = verdict_of(state(session="0.01", episode="0.01"))
    halt = verdict.halt  # type: ignore[attr-defined]
    assert (halt.guard, halt.reason) == ("cost", "cost_exceeded")
    assert halt.message == "I stopped: this request has cost 0.01, its budget is 0.01."


def test_it_halts_once_the_session_has_cost_its_budget() -> None:
    assert verdict_of(state(session="0.0499", episode="0")) is CONTINUE
    halt = verdict_of(state(session="0.05", episode="0")).halt  # type: ignore[attr-defined]
    assert "this session has cost 0.05, its budget is 0.05" in halt.message


def test_it_lets_a_session_without_pricing_or_config_be() -> None:
    unpriced = state(AgentSpec(), session="9", episode="9")
    assert verdict_of(unpriced) is CONTINUE
    off = msgspec.structs.replace(state(session="9", episode="9"), guards=GuardConfig())
    assert verdict_of(off) is CONTINUE
    assert verdict_of(state(session="9", episode="9"), "after_response") is CONTINUE


def test_a_session_with_no_cost_yet_has_spent_nothing() -> None:
    assert verdict_of(state()) is CONTINUE


def test_a_limit_of_any_precision_is_compared_exactly() -> None:
    tiny = GuardConfig(cost=CostBudget(max_cost=5e-324))
    check_guards(tiny)
    spent = msgspec.structs.replace(state(episode="5E-324"), guards=tiny)
    assert verdict_of(spent) is not CONTINUE
    under = msgspec.structs.replace(state(episode="4.9E-324"), guards=tiny)
    assert verdict_of(under) is CONTINUE


@pytest.mark.parametrize(
    ("limits", "field", "words"),
    [
        ({"max_cost": 0}, "guards.cost.max_cost", "over 0"),
        ({"max_session_cost": -1.0}, "guards.cost.max_session_cost", "over 0"),
        ({"max_cost": float("nan")}, "guards.cost.max_cost", "over 0 to 1e15"),
        ({"max_cost": float("inf")}, "guards.cost.max_cost", "over 0 to 1e15"),
        ({"max_cost": "1"}, "guards.cost.max_cost", "expected a number"),
    ],
)
def test_bad_limits_are_refused_naming_the_field(
    limits: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(InputError, match=words) as raised:
        check_guards(GuardConfig(cost=CostBudget(**limits)))  # type: ignore[arg-type]
    assert str(raised.value).startswith(field + ":")
