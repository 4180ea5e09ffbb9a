"""Unknown fields anywhere in a request body, found against the body's type."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from turnkeeper.core import AgentSpec
from turnkeeper.service._schemas import CreateSession, PostToolResults
from turnkeeper.service._strict import integral_floats_as_ints, unknown_field


class Tagged(msgspec.Struct, tag_field="kind", tag="a"):
    x: int = 0


class OtherTagged(msgspec.Struct, tag_field="kind", tag="b"):
    y: int = 0


class Holder(msgspec.Struct):
    items: tuple[Tagged | OtherTagged, ...] = ()
    pair: tuple[AgentSpec, int] | None = None
    by_name: dict[str, Tagged] = {}


@pytest.mark.parametrize(
    ("body", "kind", "found"),
    [
        (
            {"results": [{"tool_use_id": "c", "text": "x", "is_eror": True}]},
            PostToolResults,
            "results[0].is_eror",
        ),
        ({"results": [{"tool_use_id": "c", "text": "x", "is_error": True}]}, PostToolResults, None),
        ({"spec": {"system_promt": "x"}}, CreateSession, "spec.system_promt"),
        (
            {"spec": {"tools": [{"name": "t"}, {"name": "u", "input_shema": {}}]}},
            CreateSession,
            "spec.tools[1].input_shema",
        ),
        # A tool's input schema is JSON Schema, any keys: not a Struct.
        (
            {"spec": {"tools": [{"name": "t", "input_schema": {"type": "object", "x-mine": 1}}]}},
            CreateSession,
            None,
        ),
        (
            {"guards": {"budget": {"max_tokens": 5, "max_secs": 1}}},
            CreateSession,
            "guards.budget.max_secs",
        ),
        (
            {"guards": None, "history": [{"role": "user", "content": "x", "name": "n"}]},
            CreateSession,
            None,
        ),
        ({"items": [{"kind": "a", "x": 1}, {"kind": "b", "y": 2, "z": 3}]}, Holder, "items[1].z"),
        ({"pair": [{"system_prompt": "s", "tols": []}, 1]}, Holder, "pair[0].tols"),
        ({"by_name": {"k": {"kind": "a", "w": 1}}}, Holder, "by_name.k.w"),
        ({"by_name": {"k": {"kind": "a", "x": 1}}, "items": []}, Holder, None),
    ],
)
def test_unknown_field_names_the_first_unknown_field(
    body: dict[str, Any], kind: type, found: str | None
) -> None:
    # Each body decodes as its type: only the unknown field is wrong with it.
    msgspec.convert(body, kind)
    assert unknown_field(body, kind) == found


@pytest.mark.parametrize(
    ("body", "kind", "made"),
    [
        ({"max_turns": 3.0}, CreateSession, {"max_turns": 3}),
        (
            {"spec": {"max_tokens": 5.0, "temperature": 1.0, "seed": -2.0}},
            CreateSession,
            {"spec": {"max_tokens": 5, "temperature": 1.0, "seed": -2}},
        ),
        (
            {"guards": {"budget": {"max_tokens": 1e3, "max_seconds": 2.0}}},
            CreateSession,
            {"guards": {"budget": {"max_tokens": 1000, "max_seconds": 2.0}}},
        ),
        ({"items": [{"kind": "a", "x": 2.0}, {"kind": "b", "y": 3.0}]}, Holder, None),
        ({"pair": [{}, 4.0], "by_name": {"k": {"kind": "a", "x": 1.0}}}, Holder, None),
    ],
)
def test_integral_floats_become_ints_where_the_type_takes_ints(
    body: dict[str, Any], kind: type, made: dict[str, Any] | None
) -> None:
    fixed = integral_floats_as_ints(body, kind)
    assert msgspec.json.encode(fixed) != msgspec.json.encode(body)  # 3.0 == 3 in Python
    if made is not None:
        assert fixed == made
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(body, kind)
    msgspec.convert(fixed, kind)


@pytest.mark.parametrize(
    "body",
    [
        {"max_turns": 2.5},
        {"prompt": "x", "history": [{"role": "user", "n": 2.0}]},  # history is kept verbatim
        {"spec": {"temperature": 2.0}},  # a float field
        {"max_turns": 3},
    ],
)
def test_nothing_else_is_changed(body: dict[str, Any]) -> None:
    assert integral_floats_as_ints(body, CreateSession) is body
