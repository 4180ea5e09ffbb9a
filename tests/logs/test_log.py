"""check_batch: an append checked and encoded, its events kept as they read back or as given."""

from __future__ import annotations

import math

import pytest

from turnkeeper.core import UnloggableEvent
from turnkeeper.events import Envelope, ToolCalled
from turnkeeper.logs import check_batch


def call(seq: int, value: object) -> Envelope:
    return Envelope(
        "s1", seq, 1000.5 + seq, ToolCalled(tool_call_id="c", name="t", input={"v": value})
    )


def test_a_batch_holds_its_events_as_they_read_back() -> None:
    given = [call(1, (1, 2)), call(2, "x")]
    batch = check_batch(given, 0)
    first = batch.events[0].event
    assert isinstance(first, ToolCalled)
    assert first.input == {"v": [1, 2]}  # JSON has no tuple
    assert batch.events[1] == given[1]
    assert batch.events[1] is not given[1]


def test_a_batch_not_read_back_holds_the_events_given_and_the_same_json() -> None:
    given = [call(1, (1, 2)), call(2, "x")]
    batch = check_batch(given, 0, read_back=False)
    assert all(kept is event for kept, event in zip(batch.events, given, strict=True))
    assert batch.lines == check_batch(given, 0).lines
    # What a store that keeps only the JSON reads from them reads back as given.
    assert [(e.seq, e.at, e.type) for e in batch.events] == [
        (e.seq, e.at, e.type) for e in check_batch(given, 0).events
    ]


@pytest.mark.parametrize("read_back", [True, False])
def test_a_batch_that_would_not_read_back_is_refused_either_way(read_back: bool) -> None:
    bad = Envelope("s1", 1, math.nan, ToolCalled(tool_call_id="c", name="t", input={}))
    with pytest.raises(UnloggableEvent, match="session s1 seq 1: event would not read back"):
        check_batch([bad], 0, read_back=read_back)
