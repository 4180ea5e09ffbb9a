"""Tests for tool-argument validation (the jsonschema library, reworded) and coercion."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core._jsonschema import MAX_ERRORS, coerce, is_valid, schema_problem, validate

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
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "maximum": 3,
            "exclusiveMaximum": True,
        },
        3,
        ["$: 3 is greater than or equal to the exclusive maximum 3"],
    ),
    ({"multipleOf": 0.1}, 0.35, ["$: 0.35 is not a multiple of 0.1"]),
    ({"pattern": "^[a-z]+$"}, "abc1", ['$: "abc1" does not match the pattern "^[a-z]+$"']),
    ({"maxItems": 1}, [1, 2], ["$: array has 2 items, more than the maximum 1"]),
    ({"uniqueItems": True}, [1, "a", 1.0], ["$: items must be unique, but some are repeated"]),
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
        ["$: matches more than one of the oneOf alternatives, but must match one"],
    ),
    ({"not": {"type": "null"}}, None, ["$: must not match the schema given in 'not'"]),
    ({"properties": {"a": False}}, {"a": 1}, ["$: 1 is not allowed here"]),
    ({"maxLength": 1}, "ab", ["$: string has 2 characters, more than the maximum 1"]),
    ({"minItems": 2}, [1], ["$: array has 1 item, fewer than the minimum 2"]),
    ({"items": False}, [1], ["$: Expected at most 0 items but found 1 extra: 1"]),
    (
        {"$ref": "#/$defs/missing"},
        1,
        ['$: the schema\'s $ref "#/$defs/missing" cannot be resolved'],
    ),
    (
        {"$ref": "https://example.com/schema.json"},
        1,
        ['$: the schema\'s $ref "https://example.com/schema.json" cannot be resolved'],
    ),
    (
        {"$ref": "#"},
        1,
        [
            '$: the schema\'s $ref "#" leads back to itself without going into the value, so a '
            "check would never end"
        ],
    ),
    (
        {"$ref": "#/$defs/n", "$defs": {"n": {"type": "integer"}}, "maximum": 3},
        "x",
        ["$: expected integer, got string"],
    ),
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
    ({"type": "array"}, [1, 2], (1, 2)),
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
    ({"multipleOf": 3}, 9, 10),
    ({"multipleOf": 0.1}, 0.3, 0.31),
    ({"multipleOf": 0.01}, 19.99, 19.995),
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


DRAFT_07 = "http://json-schema.org/draft-07/schema#"
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        # draft-07 declared: `items` as a list and `additionalItems`; `$ref` siblings ignored
        (
            {"$schema": DRAFT_07, "items": [{"type": "integer"}], "additionalItems": False},
            [1],
            [1, 2],
        ),
        (
            {
                "$schema": DRAFT_07,
                "definitions": {"n": {"type": "integer"}},
                "$ref": "#/definitions/n",
                "maximum": 0,
            },
            5,
            "5",
        ),
        # draft-07 forms without `$schema` are read as draft-07
        ({"dependencies": {"a": ["b"]}, "items": [{"type": "string"}]}, {"a": 1, "b": 2}, {"a": 1}),
        # 2020-12 declared: `$ref` siblings apply
        (
            {
                "$schema": DRAFT_2020_12,
                "$defs": {"n": {"type": "integer"}},
                "$ref": "#/$defs/n",
                "maximum": 0,
            },
            0,
            5,
        ),
        (
            {"$schema": "https://example.com/unknown", "prefixItems": [{"type": "integer"}]},
            [1],
            ["1"],
        ),
    ],
)
def test_draft_07_and_2020_12_schemas_both_work(
    schema: dict[str, Any], good: object, bad: object
) -> None:
    assert validate(schema, good) == []
    assert validate(schema, bad) != []


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "no-such-type"}, "at $.type"),
        ({"type": 5}, "at $.type"),
        ({"pattern": "("}, "at $.pattern"),
        ({"minLength": -1}, "at $.minLength"),
        ({"required": "a"}, "at $.required"),
        ({"properties": {"a": {"type": "strin"}}}, "at $.properties.a.type"),
        ({"$schema": DRAFT_07, "prefixItems": 3, "items": 4}, "at $.items"),
    ],
)
def test_a_malformed_schema_is_one_clear_message_for_every_instance(
    schema: dict[str, Any], problem: str
) -> None:
    instances: list[object] = [{}, "x", 1]
    for instance in instances:
        [message] = validate(schema, instance)
        assert message.startswith(f"$: the tool's input schema is invalid ({problem}")
        assert message.endswith("so its arguments cannot be checked")


def test_a_schema_that_is_not_json_is_a_message() -> None:
    [message] = validate({"type": "object", "default": object()}, {})
    assert message == "$: the tool's input schema is not JSON, so its arguments cannot be checked"


def test_format_and_unknown_keywords_are_not_asserted() -> None:
    assert validate({"format": "email", "x-unknown": 1}, "not an email") == []


def test_errors_are_capped() -> None:
    schema = {"items": {"type": "string"}}
    assert len(validate(schema, list(range(100)))) == MAX_ERRORS


def test_missing_required_properties_each_get_a_message() -> None:
    schema = {"required": ["a", "b", "c"]}
    assert validate(schema, {"b": 1}) == [
        "$: missing required property 'a'",
        "$: missing required property 'c'",
    ]


def test_ref_cycles_and_deep_values_end_in_a_message() -> None:
    value: list[Any] = []
    for _ in range(5000):
        value = [value]
    too_deep = ["$: validation stopped: the schema or the value nests too deeply"]
    assert validate({"items": {"$ref": "#"}, "uniqueItems": True}, value) == too_deep
    assert validate({"anyOf": [{"$ref": "#"}, {"$ref": "#"}]}, 1) == [
        '$.anyOf[0]: the schema\'s $ref "#" leads back to itself without going into the value, '
        "so a check would never end"
    ]


LOOPS: list[dict[str, Any]] = [
    {"$ref": "#"},
    {"not": {"$ref": "#"}},
    {"allOf": [{"$ref": "#"}], "type": "object"},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
        "$ref": "#/$defs/a",
    },
    {"$anchor": "me", "$ref": "#me"},
    {"properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/a"}}},
]


def _at_depth(frames: int, check: Any) -> Any:
    """`check()` called `frames` stack frames deeper than here."""
    return check() if frames == 0 else _at_depth(frames - 1, check)


@pytest.mark.parametrize("schema", LOOPS)
def test_a_ref_in_a_circle_is_never_followed(schema: dict[str, Any]) -> None:
    """Each check of a value against a schema whose `$ref`s go round in a circle gives the
    schema's problem, at any depth of the caller's stack. The library, following them,
    recursed to the stack's limit; where the limit fell inside its Rust-backed registry,
    the RecursionError came out as a panic (a BaseException)."""
    problem = schema_problem(schema)
    assert problem is not None
    assert "leads back to itself" in problem
    arguments = {"x": "1"}
    for frames in range(0, 60, 3):
        assert _at_depth(frames, lambda: validate(schema, arguments)) == [problem]
        assert _at_depth(frames, lambda: is_valid(schema, arguments)) is False
        assert _at_depth(frames, lambda: coerce(schema, arguments)) is arguments


def test_a_recursive_definition_checks_a_value_to_64_levels() -> None:
    """A recursive definition (a tree) checks values as deep as arguments may be; a value
    deeper than that is not followed down, but told too deep, at any depth of the stack."""
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"items": {"$ref": "#/$defs/node"}},
                },
            }
        },
        "$ref": "#/$defs/node",
    }
    assert schema_problem(tree) is None

    def nested(levels: int, leaf: object) -> dict[str, Any]:
        value: dict[str, Any] = {"v": leaf}
        for _ in range(levels - 1):
            value = {"v": 1, "kids": [value]}
        return value

    # Each level is an object and a list: 32 levels of the tree are 63 of JSON.
    assert validate(tree, nested(32, 1)) == []
    wrong = validate(tree, nested(32, "x"))
    assert len(wrong) == 1
    assert wrong[0].endswith(": expected integer, got string")
    for frames in range(0, 60, 3):
        assert _at_depth(frames, lambda: validate(tree, nested(500, 1))) == [
            "$: validation stopped: the schema or the value nests too deeply"
        ]
        assert _at_depth(frames, lambda: is_valid(tree, nested(500, 1))) is False


def test_huge_numbers_do_not_crash() -> None:
    assert validate({"multipleOf": 0.1}, 10**5000) == [
        "$: validation stopped: a number is too large to check"
    ]
    assert validate({"maximum": 1}, 10**5000) != []
    assert validate({"maximum": 1}, 10**50) == [f"$: {10**50} is greater than the maximum 1"]


def test_a_schema_changed_in_place_is_checked_as_it_is_now() -> None:
    schema: dict[str, Any] = {"type": "string"}
    assert validate(schema, "x") == []
    schema["type"] = "integer"
    assert validate(schema, "x") == ["$: expected integer, got string"]


KEYWORDS = [
    "type", "properties", "required", "additionalProperties", "patternProperties", "items",
    "prefixItems", "additionalItems", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "pattern", "minItems",
    "maxItems", "uniqueItems", "minProperties", "maxProperties", "anyOf", "oneOf", "allOf",
    "not", "if", "then", "else", "$ref", "$defs", "definitions", "format", "$schema",
]  # fmt: skip
TEXT = st.sampled_from(
    ["#", "#/$defs/a", "#/definitions/0", "#/items", "integer", "string", "^a", "(", "a", DRAFT_07]
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


# Small ready-made subschemas keep generation fast; they still nest through `$ref`s.
LEAVES = st.sampled_from(
    [
        True,
        False,
        {},
        {"type": "integer"},
        {"type": "string", "minLength": 1},
        {"type": 5},
        {"$ref": "#"},
        {"$ref": "#/$defs/a"},
        {"minimum": 1, "multipleOf": 0.5},
        {"items": {"type": "null"}},
        {"required": ["a"], "additionalProperties": False},
        {"anyOf": [{"type": "null"}, {"$ref": "#"}]},
    ]
)
SCHEMAS = st.dictionaries(KEYS, JSON, max_size=6) | schema_dicts(
    LEAVES | st.dictionaries(st.sampled_from(KEYWORDS), LEAVES, max_size=3)
)


@settings(max_examples=100, deadline=None)
@given(SCHEMAS, JSON)
def test_validate_never_raises(schema: dict[str, Any], instance: object) -> None:
    errors = validate(schema, instance)
    assert isinstance(errors, list)
    assert len(errors) <= MAX_ERRORS
    assert all(isinstance(error, str) and error.startswith("$") for error in errors)


UNUSABLE = ("validation stopped: the schema or the value nests", "cannot be resolved", "invalid")


@settings(max_examples=150, deadline=None)
@given(SCHEMAS, JSON)
def test_a_schema_said_usable_checks_every_value(schema: dict[str, Any], instance: object) -> None:
    problem = schema_problem(schema)
    if problem is None:
        errors = validate(schema, instance)
        assert not [error for error in errors if any(word in error for word in UNUSABLE)]
    elif "input schema is invalid" in problem:
        assert validate(schema, instance) == [problem]


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": 5}, "$: the tool's input schema is invalid (at $.type: "),
        (
            {"$ref": "#"},
            '$: the schema\'s $ref "#" leads back to itself without going into the value',
        ),
        ({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"not": {"$ref": "#"}}}}, "leads back"),
        (
            {"properties": {"a": {"$ref": "#/$defs/gone"}}},
            "$.properties.a: the schema's $ref \"#/$",
        ),
        ({"type": "object", "properties": {"next": {"$ref": "#"}}}, None),
        ({"$defs": {"unused": {"$ref": "#/gone"}}}, None),
        ({"$ref": "http://json-schema.org/draft-07/schema#"}, None),
    ],
)
def test_schema_problem_says_why_a_schema_cannot_be_used(
    schema: dict[str, Any], problem: str | None
) -> None:
    found = schema_problem(schema)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found
        # Such a schema is not run: every check gives its problem.
        instances: list[object] = [None, 1, {"a": 1}, {"next": {}}]
        for instance in instances:
            assert validate(schema, instance) == [found]


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


@st.composite
def object_schemas(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """An object schema of typed properties, and arguments that satisfy it."""
    properties = draw(st.dictionaries(st.text(max_size=5), typed_schema(), max_size=5))
    names = sorted(properties)
    required = draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    present = [name for name in properties if name in required or draw(st.booleans())]
    return schema, {name: draw(matching(properties[name])) for name in present}


@settings(deadline=None)
@given(object_schemas())
def test_generated_matching_instances_are_valid(
    case: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    schema, instance = case
    assert validate(schema, instance) == []


@given(
    st.booleans(),
    st.sampled_from(["integer", "number", ["integer", "number"], ["number", "string"]]),
)
def test_bool_is_never_a_number(flag: bool, kind: str | list[str]) -> None:
    assert validate({"type": kind}, flag) != []
    nested = {"type": "object", "properties": {"x": {"type": "array", "items": {"type": kind}}}}
    assert validate(nested, {"x": [1, flag]}) != []


# coerce


def tool(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


# (property schema, what the model sent, what the handler gets)
COERCED: list[tuple[dict[str, Any], object, object]] = [
    ({"type": "integer"}, "3", 3),
    ({"type": "integer"}, "-12", -12),
    ({"type": "integer"}, "3.0", 3),
    ({"type": "number"}, "3.5", 3.5),
    ({"type": "number"}, "-2", -2),
    ({"type": "number"}, "1e3", 1000.0),
    ({"type": "boolean"}, "true", True),
    ({"type": "boolean"}, "False", False),
    ({"type": "null"}, "null", None),
    ({"type": ["integer", "null"]}, "null", None),
    ({"type": ["integer", "null"]}, "7", 7),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "7", 7),
    ({"$ref": "#/$defs/count"}, "7", 7),
    ({"type": "array", "items": {"type": "integer"}}, "[1, 2]", [1, 2]),
    ({"type": "array", "items": {"type": "integer"}}, '["1", 2]', [1, 2]),
    ({"type": "array", "items": {"type": "boolean"}}, ["true", False], [True, False]),
    ({"type": "object", "properties": {"n": {"type": "number"}}}, {"n": "0.5"}, {"n": 0.5}),
]

# (property schema, a value that must stay as it is)
KEPT: list[tuple[dict[str, Any], object]] = [
    ({"type": "integer"}, "3.5"),
    ({"type": "integer"}, "1e3"),
    ({"type": "integer"}, "03"),
    ({"type": "integer"}, " 3"),
    ({"type": "integer"}, "three"),
    ({"type": "integer"}, "9" * 400),
    ({"type": "number"}, "NaN"),
    ({"type": "number"}, "inf"),
    ({"type": "number"}, "1e999"),
    ({"type": "boolean"}, "yes"),
    ({"type": "boolean"}, "1"),
    ({"type": "null"}, ""),
    ({"type": "null"}, "None"),
    ({"type": "array"}, "[1, 2"),
    ({"type": "array"}, '{"a": 1}'),
    ({"type": ["integer", "string"]}, "3"),
    ({"anyOf": [{"type": "integer"}, {"const": "auto"}]}, "3"),
    ({"enum": [1, 2]}, "1"),
    ({}, "3"),
]


def defs(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "$defs": {"count": {"type": "integer"}}}


@pytest.mark.parametrize(("prop", "given", "expected"), COERCED)
def test_coerce_makes_safe_conversions(
    prop: dict[str, Any], given: object, expected: object
) -> None:
    schema = defs(tool(x=prop))
    coerced = coerce(schema, {"x": given, "other": "3"})
    assert coerced == {"x": expected, "other": "3"}
    assert type(coerced["x"]) is type(expected)
    assert validate(schema, coerced) == []


@pytest.mark.parametrize(("prop", "given"), KEPT)
def test_coerce_never_loses_anything(prop: dict[str, Any], given: object) -> None:
    arguments = {"x": given}
    assert coerce(tool(x=prop), arguments) is arguments


def test_coerce_leaves_accepted_arguments_alone() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "anyOf": [{}]}
    arguments = {"x": 3}
    assert coerce(schema, arguments) is arguments
    # A string some branch accepts is already valid, so it stays.
    either = {"anyOf": [tool(x={"type": "integer"}), tool(x={"const": "3"})]}
    assert coerce(either, {"x": "3"}) == {"x": "3"}


def test_coerce_does_not_mutate_its_input() -> None:
    arguments = {"x": ["1", "2"], "y": {"n": "5"}}
    schema = tool(x={"type": "array", "items": {"type": "integer"}}, y=tool(n={"type": "integer"}))
    assert coerce(schema, arguments) == {"x": [1, 2], "y": {"n": 5}}
    assert arguments == {"x": ["1", "2"], "y": {"n": "5"}}


def test_coerce_with_a_broken_schema_changes_nothing() -> None:
    arguments = {"x": "3"}
    assert coerce(tool(x={"type": "integer"}, y={"type": 5}), arguments) is arguments
    assert coerce(tool(x={"$ref": "#/$defs/missing"}), arguments) is arguments
    assert coerce(tool(x={"$ref": "https://example.com/n.json"}), arguments) is arguments
    cycle = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}}}
    assert coerce(cycle, arguments) == arguments


@settings(max_examples=100, deadline=None)
@given(SCHEMAS, st.dictionaries(TEXT, JSON, max_size=4))
def test_coerce_never_raises(schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    coerced = coerce(schema, arguments)
    assert isinstance(coerced, dict)
    assert coerced.keys() == arguments.keys()


@settings(deadline=None)
@given(object_schemas())
def test_coerce_never_changes_accepted_arguments(
    case: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    schema, arguments = case
    assert coerce(schema, arguments) is arguments


SCALAR_VALUES = (
    st.integers(-(10**20), 10**20).map(lambda n: ("integer", n))
    | st.floats(allow_nan=False, allow_infinity=False).map(lambda x: ("number", x))
    | st.booleans().map(lambda b: ("boolean", b))
    | st.none().map(lambda n: ("null", n))
)


@given(SCALAR_VALUES)
def test_a_scalar_written_as_json_text_comes_back(case: tuple[str, object]) -> None:
    kind, value = case
    schema = tool(x={"type": kind})
    assert coerce(schema, {"x": json.dumps(value)}) == {"x": value}
