"""is_plain_json: exactly the values the log reads back equal to themselves."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.sessions._plain import is_plain_json

SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
# JSON-like values with the kinds a Python backend may hand over beside plain ones.
VALUES = st.recursive(
    SCALARS | FLOATS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        | st.dictionaries(st.integers(0, 9), inner, max_size=3)
    ),
    max_leaves=20,
)


class Level(enum.IntEnum):
    LOW = 1


class Name(str):
    pass


class Items(list[object]):
    pass


def depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max(map(depth, value), default=0)
    return 0


@given(VALUES)
def test_plain_exactly_when_the_value_reads_back_equal_and_not_too_deep(value: Any) -> None:
    try:
        back = msgspec.json.decode(msgspec.json.encode(value))
    except (TypeError, OverflowError):
        same = False
    else:
        # Compared by repr, not ==: a tuple's repr differs from its list's, and a NaN
        # (which never equals itself) reads back as None.
        same = repr(back) == repr(value)
    assert is_plain_json(value, 3) == (same and depth(value) <= 3)


def test_dict_and_list_subclasses_read_back_equal_and_are_plain() -> None:
    value = {"a": OrderedDict(b=Items([1.5, True, None]))}
    assert is_plain_json(value, 5)
    assert msgspec.json.decode(msgspec.json.encode(value)) == value


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        {"a": [1, -math.inf]},
        (1, 2),
        {1: "a"},
        {"a": {"b"}},
        b"bytes",
        {"a"},
        frozenset(),
        Level.LOW,
        Name("a str subclass"),
        object(),
    ],
)
def test_values_that_read_back_otherwise_are_not_plain(value: object) -> None:
    assert not is_plain_json({"choices": [{"x": value}]}, 10)


def test_the_depth_counts_dicts_and_lists_not_scalars() -> None:
    assert is_plain_json({"a": [{"b": "c"}]}, 3)
    assert not is_plain_json({"a": [{"b": []}]}, 3)
    assert is_plain_json([], 1)
    assert not is_plain_json([[]], 1)
    assert is_plain_json("text", 0)
