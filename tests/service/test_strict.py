"""Unknown fields anywhere in a request body, found against the body's type."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from turnkeeper.core import AgentSpec
from turnkeeper.service._schemas import CreateSession, PostToolResults
from turnkeeper.service._strict import unknown_field


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
