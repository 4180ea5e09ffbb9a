"""The unreadable flag, read from a live response and from a logged one."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.core._calls import is_unreadable, logged_unreadable

FLAGS = st.one_of(
    st.fixed_dictionaries({"unreadable": st.sampled_from([True, False, 1, "true", None])}),
    st.sampled_from([True, "unreadable", [True], {}]),
)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["turnkeeper", "id", "x"]), inner, max_size=3)
    ),
    max_leaves=8,
)
RESPONSES = st.dictionaries(
    st.sampled_from(["turnkeeper", "choices", "id", "note", "é"]),
    FLAGS | VALUES,
    max_size=4,
)


@given(RESPONSES)
def test_a_logged_response_is_flagged_as_the_live_one_is(response: dict[str, Any]) -> None:
    assert logged_unreadable(msgspec.Raw(msgspec.json.encode(response))) == is_unreadable(response)


@pytest.mark.parametrize(
    ("spelled", "flagged"),
    [
        (b'{"turnkeeper": {"unreadable": true}}', True),
        (b'{"\\u0074urnkeeper":{"unreadable":true}}', True),
        (b'{"turnkeep\\u0065r":{"unr\\u0065adable":true}}', True),
        (b'{"turnkeeper":{"unreadable":false}}', False),
        (b'{"note":"turnkeeper unreadable true"}', False),
        (b'{"x":{"turnkeeper":{"unreadable":true}}}', False),
        (b'{"choices":[]}', False),
        # Not what this package logs, but what a log written by hand may hold.
        (b'["turnkeeper", {"unreadable": true}]', False),
        (b'"\\u0074urnkeeper"', False),
    ],
)
def test_a_logged_response_is_flagged_however_it_is_spelled(spelled: bytes, flagged: bool) -> None:
    assert logged_unreadable(msgspec.Raw(spelled)) is flagged
