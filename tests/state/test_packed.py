"""pack_state / unpack_state: a state packed gives back an equal one, or is not packed."""

from __future__ import annotations

import math
import sys
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings

from tests.state.test_state import SPEC, configs, one_by_one, session_events
from turnkeeper.core import GuardConfig
from turnkeeper.events import AnyEvent, Envelope, MessageReceived
from turnkeeper.sessions import open_session, opened_event
from turnkeeper.state import PackedState, SessionState, pack_state, unpack_state


def session_state(events: list[AnyEvent], config: GuardConfig | None = None) -> SessionState:
    """The state `events` lead to (as far as they apply), from a session opened on SPEC."""
    state = open_session(SPEC, session_id="s1", guards=config or GuardConfig())
    for seq, event in enumerate([opened_event(state), MessageReceived(text="go"), *events], 1):
        moved = one_by_one(state, [Envelope("s1", seq, 1000.0 + seq, event)])
        if not isinstance(moved, SessionState):
            break
        state = moved
    return state


@settings(max_examples=200, deadline=None)
@given(events=session_events, config=configs)
def test_every_state_a_log_leads_to_packs_and_unpacks_equal(
    events: list[AnyEvent], config: GuardConfig
) -> None:
    state = session_state(events, config)
    packed = pack_state(state)
    assert packed is not None
    assert unpack_state(packed) == state
    # What is packed is out of the state kept beside it; the rest is the state's own.
    assert packed.rest.history == ()
    assert not packed.rest.seen
    assert not packed.rest.texts
    assert packed.rest.spec is state.spec
    assert packed.rest.guards is state.guards


def test_a_packed_state_is_smaller_than_its_history_in_memory() -> None:
    state = session_state([])
    calls = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {"name": "search", "arguments": f'{{"q": "item {n}"}}'},
                }
            ],
        }
        for n in range(20)
    ]
    state = msgspec.structs.replace(state, history=(*state.history, *calls))
    packed = pack_state(state)
    assert packed is not None
    # About 110 bytes a call as msgpack, where its dicts, list and strings take over 700.
    assert len(packed.parts) * 5 < size_in_memory(state.history)
    assert unpack_state(packed) == state


def size_in_memory(value: object) -> int:
    """The bytes `value` and everything it holds take (each object counted once)."""
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def test_an_unpacked_state_shares_the_empty_sets() -> None:
    state = session_state([])
    packed = pack_state(state)
    assert packed is not None
    again = unpack_state(packed)
    assert again.seen is state.seen
    assert again.texts is state.texts


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ((1, 2), "a tuple comes back a list"),
        (math.nan, "NaN is unequal to itself"),
        (2**70, "an int past 64 bits does not encode"),
        ("\ud800", "a lone surrogate does not encode"),
        (object(), "an object msgpack cannot hold"),
    ],
)
def test_a_state_whose_history_would_not_come_back_equal_is_not_packed(
    value: Any, why: str
) -> None:
    state = session_state([])
    odd = {"role": "user", "content": "go", "extra": value}
    assert pack_state(msgspec.structs.replace(state, history=(odd,))) is None, why


def test_a_packed_state_is_a_frozen_struct() -> None:
    packed = pack_state(session_state([]))
    assert isinstance(packed, PackedState)
    with pytest.raises(AttributeError):
        packed.parts = b""  # type: ignore[misc]
