"""The fold of costs (summed exactly, by the fast path and by the rules alike) and of
`local.forked`, over envelopes built by hand."""

from __future__ import annotations

from decimal import Decimal

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, Pricing, ToolResult, ToolSpec, Usage
from turnkeeper.events import (
    AnyEvent,
    Envelope,
    Forked,
    MessageReceived,
    ModelResponded,
    ToolResultsReceived,
)
from turnkeeper.sessions import open_session, opened_event
from turnkeeper.state import SessionState, apply_event, fold, replay

SPEC = AgentSpec(tools=(ToolSpec("search"),), pricing=Pricing(0.1, 0.3))
EMPTY = msgspec.Raw(b"{}")


def call(n: int, usage: Usage) -> ModelResponded:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c{n}",
                "type": "function",
                "function": {"name": "search", "arguments": f'{{"q": "{n}"}}'},
            }
        ],
    }
    return ModelResponded(EMPTY, message, "tool_calls", usage)


def log_of(events: list[AnyEvent], at: float = 100.0) -> list[Envelope]:
    opened = opened_event(open_session(SPEC, session_id="s"))
    return [Envelope("s", seq, at + seq, event) for seq, event in enumerate([opened, *events], 1)]


def one_by_one(events: list[Envelope]) -> SessionState:
    state = open_session(SPEC, session_id="s")
    for envelope in events:
        state = apply_event(state, envelope)
    return state


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 10**7)), min_size=1, max_size=8))
def test_costs_sum_exactly_by_the_fast_path_and_the_rules(tokens: list[tuple[int, int]]) -> None:
    events: list[AnyEvent] = [MessageReceived("go")]
    expected = Decimal(0)
    for n, (prompt, completion) in enumerate(tokens):
        cost = SPEC.pricing.cost(prompt, completion)  # type: ignore[union-attr]
        expected += cost
        events.append(call(n, Usage(prompt, completion, cost)))
        events.append(ToolResultsReceived((ToolResult(f"c{n}", "r"),)))
    log = log_of(events)
    folded = replay(log)
    assert folded == one_by_one(log)
    assert folded.usage.cost == folded.episode_usage.cost == expected
    # Exactly: the price's decimals, times the tokens, over a million.
    prompt_total = sum(p for p, _ in tokens)
    completion_total = sum(c for _, c in tokens)
    exact = (Decimal("0.1") * prompt_total + Decimal("0.3") * completion_total) / 10**6
    assert folded.usage.cost == exact


def test_a_session_without_pricing_has_no_cost() -> None:
    events: list[AnyEvent] = [MessageReceived("go"), call(0, Usage(5, 1))]
    state = replay(log_of(events))
    assert state.usage == Usage(5, 1)
    assert state.usage.cost is None


def test_forked_restarts_an_open_episodes_clock_and_changes_nothing_else() -> None:
    log = log_of([MessageReceived("go"), call(0, Usage(1, 1, Decimal("4E-7")))])
    before = replay(log)
    assert before.episode_started == log[1].at
    forked = Envelope("s", 4, 900.0, Forked(origin="o", at_seq=3))
    after = fold(before, [forked])
    assert after == apply_event(before, forked)
    assert after == msgspec.structs.replace(before, seq=4, episode_started=900.0)
    resting = replay(log_of([]))
    assert fold(resting, [msgspec.structs.replace(forked, seq=2)]).episode_started is None
