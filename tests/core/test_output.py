"""Typed output in core: a type as the JSON Schema the log holds, the spec's checks, and
reading an answer's text against the schema."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import re
import uuid
from typing import Annotated, Any, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import (
    AgentSpec,
    InputError,
    ToolSpec,
    check_spec,
    decode_output,
    output_json_schema,
    output_type,
    read_answer,
    schema_key,
    validate,
    with_output_schema,
)


class Weather(msgspec.Struct):
    city: str
    temperature: float
    conditions: Literal["sunny", "rain"]


@dataclasses.dataclass
class Person:
    name: str
    age: int
    tags: list[str] = dataclasses.field(default_factory=list)


class Node(msgspec.Struct):
    value: int
    children: list[Node] = []


WEATHER_SCHEMA = {
    "title": "Weather",
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "temperature": {"type": "number"},
        "conditions": {"enum": ["rain", "sunny"]},
    },
    "required": ["city", "temperature", "conditions"],
}


def test_a_struct_is_its_schema_with_the_root_ref_resolved() -> None:
    assert output_json_schema(Weather) == WEATHER_SCHEMA
    person = output_json_schema(Person)
    assert person is not None
    assert (person["type"], person["required"]) == ("object", ["name", "age"])
    assert "$ref" not in json.dumps(person)


def test_a_recursive_type_keeps_the_definitions_its_refs_name() -> None:
    schema = output_json_schema(Node)
    assert schema is not None
    assert schema["type"] == "object"
    assert schema["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert set(schema["$defs"]) == {"Node"}
    tree = {"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}
    assert validate(schema, tree) == []
    assert validate(schema, {"value": 1, "children": [{"value": "x"}]}) != []


def test_other_types_and_schemas() -> None:
    assert output_json_schema(list[int]) == {"type": "array", "items": {"type": "integer"}}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert output_json_schema(schema) is schema
    assert output_json_schema(None) is None
    assert output_type(Weather) is Weather
    assert output_type(schema) is None
    assert output_type(None) is None


def test_the_logged_spec_holds_the_schema_and_reads_back_as_itself() -> None:
    spec = AgentSpec(system_prompt="Report.", output_schema=Weather)
    logged = with_output_schema(spec)
    assert logged.output_schema == WEATHER_SCHEMA
    assert logged.system_prompt == "Report."
    assert msgspec.json.decode(msgspec.json.encode(logged), type=AgentSpec) == logged
    plain = AgentSpec(output_schema=WEATHER_SCHEMA)
    assert with_output_schema(plain) is plain


def test_a_schema_spelled_two_ways_has_one_key() -> None:
    again = json.loads(json.dumps(WEATHER_SCHEMA, sort_keys=True))
    assert schema_key(again) == schema_key(WEATHER_SCHEMA)
    assert schema_key(WEATHER_SCHEMA) != schema_key({**WEATHER_SCHEMA, "required": ["city"]})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"type": 5}, "spec.output_schema: the schema cannot be used: $: the output schema is "),
        ({"$ref": "#"}, "spec.output_schema: the schema cannot be used: $: the schema's $ref"),
        (
            {"$ref": "#/$defs/gone"},
            "spec.output_schema: the schema cannot be used: "
            '$: the schema\'s $ref "#/$defs/gone" cannot be resolved',
        ),
        ("a string", "spec.output_schema: expected a JSON Schema object or a type msgspec"),
        (5, "spec.output_schema: expected a JSON Schema object or a type msgspec"),
        (object, "spec.output_schema: expected a JSON Schema object or a type msgspec"),
    ],
)
def test_an_output_schema_that_cannot_be_used_is_refused(given: Any, message: str) -> None:
    with pytest.raises(InputError, match="^" + re.escape(message)) as raised:
        check_spec(AgentSpec(output_schema=given))
    assert "the tool's input schema" not in str(raised.value)


def test_an_output_schema_and_a_terminal_tool_are_refused_together() -> None:
    finish = ToolSpec("finish", "Finish", {"type": "object"})
    spec = AgentSpec(tools=(finish,), terminal_tool="finish", output_schema=Weather)
    with pytest.raises(
        InputError, match=r"^spec\.output_schema: the spec's terminal_tool 'finish'"
    ):
        check_spec(spec)
    check_spec(AgentSpec(tools=(finish,), output_schema=Weather))


PARIS = {"city": "Paris", "temperature": 12, "conditions": "rain"}


@pytest.mark.parametrize(
    "text",
    [
        '{"city": "Paris", "temperature": 12, "conditions": "rain"}',
        '  {"city": "Paris", "temperature": 12, "conditions": "rain"}\n',
        '```json\n{"city": "Paris", "temperature": 12, "conditions": "rain"}\n```',
        '```\n{"city": "Paris", "temperature": 12, "conditions": "rain"}```',
        # The safe coercions of tool arguments: "12" for a number is 12.
        '{"city": "Paris", "temperature": "12", "conditions": "rain"}',
    ],
)
def test_an_answer_that_matches_gives_its_value(text: str) -> None:
    assert read_answer(WEATHER_SCHEMA, text) == (PARIS, None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "it is empty, not a JSON value"),
        ("   ", "it is empty, not a JSON value"),
        ("It is 12 degrees in Paris.", "it is not a JSON value"),
        ('{"city": "Paris"} and more', "it is not a JSON value"),
        ('{"city": "Paris", "temperature": NaN, "conditions": "rain"}', "it is not a JSON value"),
        (
            '{"city": "Paris", "temperature": 12}',
            "it does not match the output schema: $: missing required property 'conditions'",
        ),
        (
            '{"city": 3, "temperature": 12, "conditions": "snow"}',
            "it does not match the output schema: $.city: expected string, got integer; "
            '$.conditions: "snow" is not one of ["rain", "sunny"]',
        ),
        ("[1, 2]", "it does not match the output schema: $: expected object, got array"),
        ("[" * 70 + "]" * 70, "it nests more than 64 levels deep"),
    ],
)
def test_an_answer_that_does_not_match_says_why(text: str | None, problem: str) -> None:
    assert read_answer(WEATHER_SCHEMA, text) == (None, problem)


def test_many_problems_are_cut_to_five() -> None:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(8)}}
    _, problem = read_answer(schema, json.dumps({f"p{i}": "x" for i in range(8)}))
    assert problem is not None
    assert problem.count("expected integer") == 5
    assert problem.endswith("(and 3 more)")


def test_any_json_value_may_be_the_answer() -> None:
    assert read_answer({"type": "array", "items": {"type": "integer"}}, "[1, 2, 3]") == (
        [1, 2, 3],
        None,
    )
    assert read_answer({"type": "string"}, '"Paris"') == ("Paris", None)
    assert read_answer({"type": "string"}, "Paris") == (None, "it is not a JSON value")


def test_the_value_decodes_into_the_type() -> None:
    value, _ = read_answer(
        WEATHER_SCHEMA, '{"city": "Oslo", "temperature": -3, "conditions": "sunny"}'
    )
    assert decode_output(value, Weather) == Weather("Oslo", -3.0, "sunny")
    assert decode_output({"name": "Ada", "age": 36}, Person) == Person("Ada", 36)


def test_a_value_the_schema_admits_and_the_type_does_not_is_an_error() -> None:
    class When(msgspec.Struct):
        at: datetime.datetime

    schema = output_json_schema(When)
    assert schema is not None
    value, problem = read_answer(schema, '{"at": "tomorrow"}')
    assert problem is None  # a naive datetime's schema is any string
    with pytest.raises(msgspec.ValidationError, match="datetime"):
        decode_output(value, When)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["city", "temperature", "conditions", "x"]), children)
    ),
    max_leaves=12,
)


@settings(max_examples=200)
@given(JSON, st.sampled_from(["{}", "```json\n{}\n```", " {} "]))
def test_a_read_answer_matches_the_schema_and_is_json(value: Any, frame: str) -> None:
    """Whatever the text, reading it raises nothing; a value read matches the schema and
    logs as itself (no NaN or infinity, which JSON does not hold)."""
    try:
        body = json.dumps(value)
    except ValueError:
        return
    read, problem = read_answer(WEATHER_SCHEMA, frame.replace("{}", body))
    if problem is None:
        assert validate(WEATHER_SCHEMA, read) == []
        assert msgspec.json.decode(msgspec.json.encode(read)) == read
    else:
        assert read is None
        assert problem.startswith("it ")


@settings(max_examples=200)
@given(st.text(max_size=60))
def test_any_text_reads_without_raising(text: str) -> None:
    read, problem = read_answer(WEATHER_SCHEMA, text)
    if problem is None:
        assert validate(WEATHER_SCHEMA, read) == []
    else:
        assert read is None


class Booking(msgspec.Struct):
    on: datetime.date
    id: uuid.UUID
    at: Annotated[datetime.datetime, msgspec.Meta(tz=True)]
    price: decimal.Decimal
    length: datetime.timedelta


def test_the_formats_msgspec_writes_are_checked_as_it_decodes_them() -> None:
    """A string a Struct's schema gives a format to must be one msgspec decodes into the
    field's type: the answer is then repaired, not refused when decoded."""
    schema = output_json_schema(Booking)
    assert schema is not None
    good = {
        "on": "2024-02-28",
        "id": "c0a8f6f2-7c3a-4c3a-9a3a-1a2b3c4d5e6f",
        "at": "2024-02-28T09:30:00+01:00",
        "price": "19.99",
        "length": "PT1H30M",
    }
    value, problem = read_answer(schema, json.dumps(good))
    assert problem is None
    assert decode_output(value, Booking).length == datetime.timedelta(hours=1, minutes=30)
    bad = {**good, "on": "2024-02-30", "id": "x", "at": "2024-02-28T09:30:00", "price": "a"}
    _, problem = read_answer(schema, json.dumps(bad))
    assert problem == (
        'it does not match the output schema: $.on: "2024-02-30" is not a valid date; '
        '$.id: "x" is not a valid uuid; $.at: "2024-02-28T09:30:00" is not a valid '
        'date-time; $.price: "a" is not a valid decimal'
    )


def test_other_formats_and_tool_arguments_are_not_asserted() -> None:
    schema = {"type": "object", "properties": {"on": {"type": "string", "format": "date"}}}
    assert validate(schema, {"on": "someday"}) == []
    assert validate(schema, {"on": "someday"}, formats=True) != []
    email = {"type": "string", "format": "email"}
    assert read_answer(email, '"not an address"') == ("not an address", None)
