"""Tool results logged once: `results_received` gives by position what `returned`
already holds, `results_of` gives them whole again, a log without `logged` (written
before it) reads as ever, and a reference to nothing is a ReplayError."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.core import ReplayError, ToolResult
from turnkeeper.events import (
    Envelope,
    ToolResultsReceived,
    ToolReturned,
    decode_envelope,
    encode_envelope,
)
from turnkeeper.state import results_of, results_received, whole_results

results = st.lists(
    st.builds(
        ToolResult,
        st.sampled_from(["a", "b", "c", "d"]),
        st.text(max_size=5),
        st.booleans(),
    ),
    max_size=5,
)


@given(returned=results, given_results=results)
def test_what_is_given_by_position_reads_back_whole(
    returned: list[ToolResult], given_results: list[ToolResult]
) -> None:
    event = results_received(returned, given_results)
    assert results_of(returned, event) == tuple(given_results)
    for index in event.logged:
        assert event.results[index].text == ""
        assert given_results[index].text != ""
    # As logged and read back.
    read = decode_envelope(encode_envelope(Envelope("s", 1, 0.0, event))).event
    assert isinstance(read, ToolResultsReceived)
    assert results_of(returned, read) == tuple(given_results)


def test_the_last_result_of_a_call_counts_and_events_count_as_results() -> None:
    returned = [ToolReturned("a", "old"), ToolReturned("a", "new", is_error=True)]
    event = ToolResultsReceived(results=(ToolResult("a", "", is_error=True),), logged=(0,))
    assert results_of(returned, event) == (ToolResult("a", "new", is_error=True),)


def test_an_event_without_logged_encodes_as_before_and_is_its_own_results() -> None:
    old = ToolResultsReceived(results=(ToolResult("a", "5"),))
    assert b"logged" not in msgspec.json.encode(old)
    assert results_of([], old) is old.results


@pytest.mark.parametrize("logged", [(0,), (1,), (-1,)])
def test_a_reference_to_nothing_is_a_replay_error(logged: tuple[int, ...]) -> None:
    event = ToolResultsReceived(results=(ToolResult("a", ""),), logged=logged)
    assert results_of([ToolResult("b", "x")], event) is None
    with pytest.raises(ReplayError, match="session s: seq 4 refers to a tool result"):
        whole_results([ToolResult("b", "x")], event, "session s: seq 4")
