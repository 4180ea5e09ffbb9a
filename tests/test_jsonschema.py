"""Tests for the tool-argument JSON Schema validator."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper._jsonschema import MAX_ERRORS, validate

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 5},
        "items": {"type": "array", "items": {"type": "integer", "maximum": 5}},
    },
    "required": ["city"],
    "additionalProperties": False,
}

# (schema, instance, the exact errors)
MESSAGES: list[tuple[dict[str, Any], object, list[str]]] = [
    (WEATHER, {"city": 3}, ["$.city: expected string, got integer"]),
    (WEATHER, {}, ["$: missing required property 'city'"]),
    (
        WEATHER,
        {"city": "Oslo", "items": [1, 2, 7]},
        ["$.items[2]: 7 is greater than the maximum 5"],
    ),
    (WEATHER, {"city": "Oslo", "days": 0}, ["$.days: 0 is less than the minimum 1"]),
    (
        WEATHER,
        {"city": "Oslo", "unit": "kelvin"},
        ['$.unit: "kelvin" is not one of ["celsius", "fahrenheit"]'],
    ),
    (
        WEATHER,
        {"city": "Oslo", "colour": "red"},
        ["$: unexpected property 'colour' (allowed: 'city', 'unit', 'days', 'items')"],
    ),
    (
        WEATHER,
        {"city": "", "days": 2.5, "zip": 1},
        [
            "$.city: string has 0 characters, fewer than the minimum 1",
            "$.days: expected integer, got number",
            "$: unexpected property 'zip' (allowed: 'city', 'unit', 'days', 'items')",
        ],
    ),
    (WEATHER, [], ["$: expected object, got array"]),
    ({"type": ["string", "null"]}, 1, ["$: expected string or null, got integer"]),
    (
        {"properties": {"a b": {"type": "string"}}},
        {"a b": 1},
        ['$["a b"]: expected string, got integer'],
    ),
    ({"const": "go"}, "stop", ['$: expected "go", got "stop"']),
    ({"exclusiveMinimum": 0}, 0, ["$: 0 is less than or equal to the exclusive minimum 0"]),
    (
        {"maximum": 3, "exclusiveMaximum": True},
        3,
        ["$: 3 is greater than or equal to the exclusive maximum 3"],
    ),
    ({"multipleOf": 0.1}, 0.35, ["$: 0.35 is not a multiple of 0.1"]),
    ({"pattern": "^[a-z]+$"}, "abc1", ['$: "abc1" does not match the pattern "^[a-z]+$"']),
    ({"maxItems": 1}, [1, 2], ["$: array has 2 items, more than the maximum 1"]),
    ({"uniqueItems": True}, [1, "a", 1.0], ["$: items 0 and 2 are equal, but must be unique"]),
    ({"minProperties": 1}, {}, ["$: object has 0 properties, fewer than the minimum 1"]),
    (
        {"anyOf": [{"type": "string"}, {"type": "null"}]},
        3,
        [
            "$: does not match any of the anyOf alternatives: "
            "[1] expected string, got integer; [2] expected null, got integer"
        ],
    ),
    (
        {"oneOf": [{"type": "integer"}, {"minimum": 0}]},
        1,
        ["$: matches alternatives 1 and 2 of oneOf, but must match exactly one"],
    ),
    ({"not": {"type": "null"}}, None, ["$: must not match the schema given in 'not'"]),
    ({"items": False}, [1], ["$[0]: no value is allowed here"]),
    (
        {"$ref": "#/$defs/missing"},
        1,
        ['$: the schema\'s $ref "#/$defs/missing" cannot be resolved'],
    ),
    ({"$ref": "#"}, 1, ["$: the value or the schema nests too deeply (is there a $ref cycle?)"]),
]


@pytest.mark.parametrize(("schema", "instance", "expected"), MESSAGES)
def test_messages_name_the_path_and_the_problem(
    schema: dict[str, Any], instance: object, expected: list[str]
) -> None:
    assert validate(schema, instance) == expected


# (schema, a valid instance, an invalid instance) per keyword
CASES: list[tuple[dict[str, Any], object, object]] = [
    ({"type": "string"}, "x", b"x"),
    ({"type": "integer"}, 3, 3.5),
    ({"type": "integer"}, 3.0, True),
    ({"type": "number"}, 2.5, False),
    ({"type": "null"}, None, 0),
    ({"type": "boolean"}, False, 0),
    ({"type": "array"}, (1, 2), {"0": 1}),
    ({"type": ["integer", "string"]}, "x", None),
    ({"properties": {"a": {"type": "integer"}}}, {"b": "x"}, {"a": "x"}),
    ({"required": ["a", "b"]}, {"a": 1, "b": 2}, {"a": 1}),
    ({"required": ["a"]}, "not an object", {}),
    ({"additionalProperties": {"type": "integer"}}, {"x": 1}, {"x": "1"}),
    ({"patternProperties": {"^n_": {"type": "integer"}}}, {"n_a": 1, "s": "x"}, {"n_a": "1"}),
    (
        {"properties": {"a": {}}, "patternProperties": {"^x": {}}, "additionalProperties": False},
        {"a": 1, "xy": 2},
        {"a": 1, "y": 2},
    ),
    ({"items": {"type": "integer"}}, [1, 2], [1, "2"]),
    ({"items": [{"type": "integer"}, {"type": "string"}]}, [1, "a", None], [1, 2]),
    ({"items": [{"type": "integer"}], "additionalItems": False}, [1], [1, 2]),
    ({"prefixItems": [{"type": "integer"}], "items": {"type": "string"}}, [1, "a"], [1, 2]),
    ({"enum": [1, "a", None]}, 1.0, True),
    ({"enum": [[1, {"a": True}]]}, [1, {"a": True}], [1, {"a": 1}]),
    ({"const": False}, False, 0),
    ({"const": {"a": [1]}}, {"a": [1.0]}, {"a": [1], "b": 2}),
    ({"minimum": 2}, 2, 1.999),
    ({"maximum": 2}, 2.0, 3),
    ({"exclusiveMinimum": 2}, 2.001, 2),
    ({"exclusiveMaximum": 2}, 1, 2),
    ({"minimum": 2, "exclusiveMinimum": True}, 3, 2),
    ({"multipleOf": 3}, 9, 10),
    ({"multipleOf": 0.1}, 0.3, 0.31),
    ({"minLength": 2}, "😀😀", "😀"),
    ({"maxLength": 1}, "😀", "ab"),
    ({"pattern": r"\d"}, "a1b", "ab"),
    ({"minItems": 1}, [0], []),
    ({"maxItems": 1}, [0], [0, 0]),
    ({"uniqueItems": True}, [1, True, "1"], [{"a": 1}, {"a": 1}]),
    ({"minProperties": 1}, {"a": 1}, {}),
    ({"maxProperties": 1}, {"a": 1}, {"a": 1, "b": 2}),
    ({"anyOf": [{"type": "integer"}, {"minLength": 3}]}, "abc", "ab"),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, 1, None),
    ({"allOf": [{"minimum": 1}, {"maximum": 3}]}, 2, 4),
    ({"not": {"type": "string"}}, 1, "1"),
    ({"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}}, "a", -1),
    ({"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}}, 1, None),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, 1, "1"),
    ({"definitions": {"a/b~c": {"type": "integer"}}, "$ref": "#/definitions/a~1b~0c"}, 1, "1"),
    (
        {"properties": {"child": {"$ref": "#"}}, "required": ["v"]},
        {"v": 1, "child": {"v": 2}},
        {
            "v": 1,
            "child": {},
        },
    ),
    ({"properties": {"a": True, "b": False}}, {"a": 1}, {"b": 1}),
]


@pytest.mark.parametrize(("schema", "good", "bad"), CASES)
def test_each_keyword_accepts_and_rejects(
    schema: dict[str, Any], good: object, bad: object
) -> None:
    assert validate(schema, good) == []
    errors = validate(schema, bad)
    assert errors
    assert all(error.startswith("$") for error in errors)


@pytest.mark.parametrize(
    "schema",
    [
        {"format": "email", "x-unknown": 1},
        {"pattern": "("},
        {"type": "no-such-type"},
        {"type": 5, "properties": [], "required": "a", "items": 3, "enum": "ab", "minimum": "1"},
        {"minLength": True, "multipleOf": 0, "anyOf": [], "oneOf": {}, "not": 5, "if": "x"},
        {"$ref": "https://example.com/schema.json"},
    ],
)
def test_unknown_or_malformed_keywords_are_ignored(schema: dict[str, Any]) -> None:
    assert validate(schema, "anything") == []


def test_errors_are_capped() -> None:
    schema = {"items": {"type": "string"}}
    assert len(validate(schema, list(range(100)))) == MAX_ERRORS


def test_exponential_ref_cycles_stop_with_an_error() -> None:
    schema = {"anyOf": [{"$ref": "#"}, {"$ref": "#"}]}
    assert validate(schema, 1) == [
        "$: validation stopped: the schema or the value is too large or too complex"
    ]


def test_deep_values_are_bounded() -> None:
    value: list[Any] = []
    for _ in range(5000):
        value = [value]
    errors = validate({"items": {"$ref": "#"}, "uniqueItems": True}, value)
    assert len(errors) == 1
    assert "nests too deeply" in errors[0]
    assert validate({"enum": [value]}, value) == []
    assert validate({"enum": [[value]]}, value) != []


def test_huge_numbers_do_not_crash() -> None:
    assert validate({"multipleOf": 0.1}, 10**5000) == []
    assert validate({"maximum": 1}, 10**5000) == ["$: <integer> is greater than the maximum 1"]
    assert validate({"multipleOf": 7}, float("inf")) == []


KEYWORDS = [
    "type", "properties", "required", "additionalProperties", "patternProperties", "items",
    "prefixItems", "additionalItems", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern", "minItems",
    "maxItems", "uniqueItems", "minProperties", "maxProperties", "anyOf", "oneOf", "allOf",
    "not", "if", "then", "else", "$ref", "$defs", "definitions", "format",
]  # fmt: skip
TEXT = st.sampled_from(
    ["#", "#/$defs/a", "#/definitions/0", "#/items", "integer", "string", "^a", "(", "a"]
) | st.text(max_size=4)
KEYS = st.sampled_from(KEYWORDS) | TEXT
SCALARS = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | TEXT
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=30,
)
TYPES = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])
NUMBERS = st.integers(-5, 5) | st.floats(-5, 5) | st.booleans()
NUMERIC_KEYWORDS = [
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
    "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
]  # fmt: skip


def schema_dicts(sub: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Schemas whose keywords mostly hold the right kind of value, so validation goes deep."""
    lists = st.lists(sub, max_size=3)
    return st.fixed_dictionaries(
        {},
        optional={
            "type": TYPES | st.lists(TYPES, max_size=3),
            "properties": st.dictionaries(TEXT, sub, max_size=3),
            "required": st.lists(TEXT, max_size=3),
            "additionalProperties": sub,
            "patternProperties": st.dictionaries(TEXT, sub, max_size=2),
            "items": sub | lists,
            "prefixItems": lists,
            "enum": st.lists(JSON, max_size=3),
            "const": JSON,
            **dict.fromkeys(NUMERIC_KEYWORDS, NUMBERS),
            "pattern": TEXT,
            "uniqueItems": st.booleans(),
            **dict.fromkeys(["anyOf", "oneOf", "allOf"], lists),
            **dict.fromkeys(["not", "if", "then", "else", "additionalItems"], sub),
            "$ref": st.sampled_from(["#", "#/$defs/a", "#/properties/a", "#/items/0", "#/x"]),
            "$defs": st.fixed_dictionaries({"a": sub}),
        },
    )


SCHEMAS = st.dictionaries(KEYS, JSON, max_size=6) | schema_dicts(
    st.recursive(st.booleans() | st.just({}), schema_dicts, max_leaves=8)
)


@settings(max_examples=200)
@given(SCHEMAS, JSON)
def test_validate_never_raises(schema: dict[str, Any], instance: object) -> None:
    errors = validate(schema, instance)
    assert isinstance(errors, list)
    assert len(errors) <= MAX_ERRORS
    assert all(isinstance(error, str) and error.startswith("$") for error in errors)


@st.composite
def typed_schema(draw: st.DrawFn) -> dict[str, Any]:
    """A property schema of one type with a few constraints."""
    kind = draw(
        st.sampled_from(["string", "integer", "number", "boolean", "null", "enum", "array"])
    )
    if kind == "string":
        return {"type": "string", "minLength": draw(st.integers(0, 3)), "maxLength": 8}
    if kind in ("integer", "number"):
        low = draw(st.integers(-100, 100))
        return {"type": kind, "minimum": low, "maximum": low + draw(st.integers(0, 50))}
    if kind == "enum":
        values = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT
        return {"enum": draw(st.lists(values, min_size=1, max_size=4))}
    if kind == "array":
        return {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
    return {"type": kind}


def matching(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that satisfy a schema made by `typed_schema`."""
    kind = schema.get("type")
    if kind == "string":
        return st.text(min_size=schema["minLength"], max_size=8)
    if kind == "integer":
        return st.integers(schema["minimum"], schema["maximum"])
    if kind == "number":
        return st.floats(schema["minimum"], schema["maximum"])
    if kind == "array":
        return st.lists(st.integers(), max_size=3)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.sampled_from(schema["enum"])


@given(st.dictionaries(st.text(max_size=5), typed_schema(), max_size=5), st.data())
def test_generated_matching_instances_are_valid(
    properties: dict[str, dict[str, Any]], data: st.DataObject
) -> None:
    names = sorted(properties)
    required = data.draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    present = [name for name in properties if name in required or data.draw(st.booleans())]
    instance = {name: data.draw(matching(properties[name])) for name in present}
    assert validate(schema, instance) == []


@given(
    st.booleans(),
    st.sampled_from(["integer", "number", ["integer", "number"], ["number", "string"]]),
)
def test_bool_is_never_a_number(flag: bool, kind: str | list[str]) -> None:
    assert validate({"type": kind}, flag) != []
    nested = {"type": "object", "properties": {"x": {"type": "array", "items": {"type": kind}}}}
    assert validate(nested, {"x": [1, flag]}) != []
