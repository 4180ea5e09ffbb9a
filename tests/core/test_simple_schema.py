"""The fast check of simple schemas agrees with the jsonschema library on every value."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator, Draft202012Validator

from turnkeeper.core._jsonschema import _checker, coerce, is_valid, validate
from turnkeeper.core._simple_schema import compile_simple

TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
TYPE = st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), min_size=1, unique=True)
NAMES = st.sampled_from(["a", "b", "q", "city", "n"])


def simple_schemas() -> st.SearchStrategy[Any]:
    """Schemas built only from the keywords the fast check handles."""
    leaf = st.booleans() | st.fixed_dictionaries(
        {},
        optional={
            "type": TYPE,
            "enum": st.lists(st.text(max_size=3), max_size=4),
            "description": st.text(max_size=5),
            "format": st.sampled_from(["date", "email"]),
        },
    )
    return st.recursive(
        leaf,
        lambda children: st.fixed_dictionaries(
            {},
            optional={
                "type": TYPE,
                "properties": st.dictionaries(NAMES, children, max_size=3),
                "required": st.lists(NAMES, max_size=3, unique=True),
                "additionalProperties": children,
                "items": children,
                "enum": st.lists(st.text(max_size=3), max_size=4),
                "title": st.text(max_size=5),
            },
        ),
        max_leaves=8,
    )


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=True)
    | st.sampled_from([1.0, -0.0, 2.5])
    | st.text(max_size=3)
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(NAMES, children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(simple_schemas(), VALUES)
def test_the_fast_check_agrees_with_the_library(schema: Any, value: object) -> None:
    check = compile_simple(schema)
    assert check is not None
    for library in (Draft202012Validator, Draft7Validator):
        assert check(value) == library(schema).is_valid(value), (schema, value, library)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(NAMES, simple_schemas(), max_size=3), VALUES)
def test_validate_and_coerce_agree_with_the_library_through_the_fast_path(
    properties: dict[str, Any], value: object
) -> None:
    schema = {"type": "object", "properties": properties}
    checker = _checker(schema)
    assert not isinstance(checker, str)
    assert checker.simple is not None
    library = Draft202012Validator(schema).is_valid(value)
    assert is_valid(schema, value) == library
    assert (validate(schema, value) == []) == library
    if isinstance(value, dict) and library:
        assert coerce(schema, value) is value


def test_schemas_beyond_the_subset_are_left_to_the_library() -> None:
    for schema in (
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}},
        {"$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}},
        {"enum": [1, "a"]},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"items": [{"type": "string"}]},
        {"properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
        "not a schema",
    ):
        assert compile_simple(schema) is None, schema


def test_a_draft_4_schema_gets_no_fast_check() -> None:
    # Draft 4 alone refuses 1.0 as an integer.
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
    checker = _checker(schema)
    assert not isinstance(checker, str)
    assert checker.simple is None
    assert not is_valid(schema, 1.0)
    assert is_valid({"type": "integer"}, 1.0)


def test_an_invalid_schema_is_still_refused_with_its_message() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "strng"}}}
    assert validate(schema, {"a": 1})[0].startswith("$: the tool's input schema is invalid")
    assert not is_valid(schema, {"a": 1})


def test_a_simple_schema_changed_in_place_is_checked_as_it_is_now() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert is_valid(schema, {"a": "x"})
    schema["properties"]["a"]["type"] = "integer"
    assert not is_valid(schema, {"a": "x"})
    assert validate(schema, {"a": "x"}) == ["$.a: expected integer, got string"]
