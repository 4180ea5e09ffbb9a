"""Naming the field of a lone surrogate in a JSON body."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.service._surrogates import lone_surrogate

# Text strategies hold no surrogates: Hypothesis leaves them out.
KEYS = st.text(max_size=5)
TEXT = st.text(max_size=8) | st.just("\\ud800")
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


def string_paths(value: Any, path: str = "") -> list[tuple[str, list[Any]]]:
    """Each string in `value` as (its field path, the keys and indexes that reach it)."""
    found: list[tuple[str, list[Any]]] = []
    if isinstance(value, str):
        found.append((path.lstrip(".") or "body", []))
    elif isinstance(value, dict):
        for key, item in value.items():
            found += [(p, [key, *steps]) for p, steps in string_paths(item, f"{path}.{key}")]
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += [(p, [index, *steps]) for p, steps in string_paths(item, f"{path}[{index}]")]
    return found


@given(VALUES)
def test_a_body_with_no_lone_surrogate_has_none_named(value: Any) -> None:
    assert lone_surrogate(msgspec.json.encode(value)) is None
    assert lone_surrogate(json.dumps(value).encode()) is None


@given(VALUES, st.data())
def test_the_one_lone_surrogate_is_named_by_its_path(value: Any, data: st.DataObject) -> None:
    paths = string_paths(value)
    if not paths:
        value, paths = [value, ""], string_paths([value, ""])
    path, steps = data.draw(st.sampled_from(paths))
    surrogate = data.draw(st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]))
    holder = value
    for step in steps[:-1]:
        holder = holder[step]
    if steps:
        holder[steps[-1]] += surrogate
    else:
        value += surrogate
    # ensure_ascii: the surrogate goes as its escape, as a client's JSON library sends it.
    body = json.dumps(value).encode()
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(body)
    assert lone_surrogate(body) == (
        path,
        f"{path}: holds a lone surrogate (a \\ud800 to \\udfff escape without its pair), "
        "which is not text",
    )


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"prompt": "\\ud800"}', "prompt"),
        (b'{"a": ["x", "\\udfff\\ud800"]}', "a[1]"),
        (b'{"a": {"\\ud800": 1}}', "a"),
        (b'"\\ud800"', "body"),
    ],
)
def test_examples(body: bytes, named: str) -> None:
    found = lone_surrogate(body)
    assert found is not None
    assert found[0] == named


@pytest.mark.parametrize(
    "body",
    [
        b'{"ok": "\\ud83d\\ude00"}',  # a pair: one character
        b'{"text": "\\\\ud800"}',  # an escaped backslash, then the letters
        b'{"prompt": "\\ud800", "x": NaN}',  # not JSON for another reason too
        b'{"prompt": "\\ud800"',
        b'{"prompt": "\\ud800", "x": "\xff"}',
    ],
)
def test_nothing_is_named_where_no_lone_surrogate_is_the_one_problem(body: bytes) -> None:
    assert lone_surrogate(body) is None
