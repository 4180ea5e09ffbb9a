"""Tool ranking against the user's message, and compact schemas."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import InputError, ToolSpec, validate
from turnkeeper.providers._ranking import (
    SCHEMA_BUDGET,
    compact_schema,
    rank_tools,
)


def tool(name: str, description: str = "", *parameters: str) -> ToolSpec:
    properties = {parameter: {"type": "string"} for parameter in parameters}
    return ToolSpec(name, description, {"type": "object", "properties": properties})


SHOP = [
    tool("search_products", "Search the catalogue by keywords", "query"),
    tool("open_product", "Open a product page", "product_id"),
    tool("add_to_cart", "Put an item in the shopping cart", "product_id", "quantity"),
    tool("get_weather", "Current weather and forecast for a city", "city"),
    tool("clock", "The current time"),
    tool("sendEmail", "Send an email message", "recipient", "subject", "body"),
    tool("list_orders", "Past orders of the customer"),
    tool("track_shipment", "Where a parcel is now", "tracking_number"),
    tool("convert_currency", "Convert an amount between currencies", "amount", "currency"),
    tool("translate", "Translate text into another language", "text", "language"),
]


def names(tools: list[ToolSpec]) -> list[str]:
    return [t.name for t in tools]


@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("What's the weather like in Lisbon tomorrow?", "get_weather"),
        ("Please add two of those to my cart", "add_to_cart"),
        ("search for running shoes", "search_products"),
        ("email my boss that I'm late", "sendEmail"),
        ("where is my parcel? tracking number 123", "track_shipment"),
        ("how much is 20 EUR in another currency", "convert_currency"),
        ("call open_product for item 7", "open_product"),
        ("Übersetze diesen Text (translate it)", "translate"),
    ],
)
def test_the_best_match_is_kept(query: str, best: str) -> None:
    assert names(rank_tools(SHOP, query, max_tools=1)) == [best]


def test_name_outweighs_a_parameter_which_outweighs_the_description() -> None:
    tools = [
        tool("lookup", "find a city", "x"),
        tool("lookup2", "", "city"),
        tool("city", "", "y"),
    ]
    assert names(rank_tools(tools, "city", max_tools=1)) == ["city"]
    assert names(rank_tools(tools[:2], "city", max_tools=1)) == ["lookup2"]


def test_the_chosen_tools_keep_their_given_order() -> None:
    chosen = rank_tools(SHOP, "add the product to the cart after search", max_tools=3)
    assert names(chosen) == ["search_products", "open_product", "add_to_cart"]


def test_all_tools_are_kept_when_they_fit() -> None:
    assert rank_tools(SHOP, "anything", max_tools=len(SHOP)) == SHOP
    assert rank_tools([], "anything") == []


def test_recent_tools_get_a_bonus_the_newest_most() -> None:
    assert names(rank_tools(SHOP, "ok, go on", max_tools=1, recent=["clock"])) == ["clock"]
    assert names(rank_tools(SHOP, "ok", max_tools=1, recent=["translate", "clock"])) == [
        "translate"
    ]
    # A clear match in the message still beats the bonus.
    chosen = rank_tools(SHOP, "weather in Oslo", max_tools=1, recent=["clock"])
    assert names(chosen) == ["get_weather"]


def test_ties_keep_the_given_order() -> None:
    assert rank_tools(SHOP, "nothing matches this", max_tools=3) == SHOP[:3]


def test_stopwords_and_one_letter_words_do_not_count() -> None:
    tools = [tool("first", ""), tool("the_a_is", "the a is of")]
    assert names(rank_tools(tools, "the a is of", max_tools=1)) == ["first"]


@pytest.mark.parametrize("max_tools", [0, -1, 1.5, True, "8"])
def test_max_tools_must_be_a_positive_int(max_tools: Any) -> None:
    with pytest.raises(InputError, match="rank_tools: max_tools must be an int >= 1"):
        rank_tools(SHOP, "x", max_tools=max_tools)


WORDS = [
    "search", "searches", "get_weather", "addToCart", "clock", "list", "send_email", "book",
    "booking", "books", "translate", "open", "x", "a1", "the", "city", "queries", "query", "é",
]  # fmt: skip
TOOL_NAMES = st.sampled_from([word for word in WORDS if word.isascii()])
TEXTS = st.lists(st.sampled_from(WORDS), max_size=8).map(" ".join) | st.text(max_size=30)
TOOLS = st.lists(st.builds(tool, TOOL_NAMES, TEXTS, TOOL_NAMES), max_size=20)


@settings(deadline=None)
@given(TOOLS, TEXTS, st.integers(1, 10), st.lists(TOOL_NAMES, max_size=4))
def test_ranking_returns_at_most_max_tools_in_order_and_is_deterministic(
    tools: list[ToolSpec], query: str, max_tools: int, recent: list[str]
) -> None:
    chosen = rank_tools(tools, query, max_tools=max_tools, recent=recent)
    assert len(chosen) == min(max_tools, len(tools))
    positions = [next(i for i, t in enumerate(tools) if t is c) for c in chosen]
    assert positions == sorted(positions)
    assert rank_tools(tools, query, max_tools=max_tools, recent=recent) == chosen


@given(TOOLS, TEXTS, st.integers(1, 10))
def test_fewer_tools_are_the_best_of_more(
    tools: list[ToolSpec], query: str, max_tools: int
) -> None:
    more = rank_tools(tools, query, max_tools=max_tools + 1)
    fewer = rank_tools(tools, query, max_tools=max_tools)
    assert all(any(t is m for m in more) for t in fewer)


# compact_schema

LONG = "A long explanation of what this does. " * 8


def big_schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Booking",
        "description": LONG,
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": LONG, "examples": ["Oslo", "Lima"]},
            "nights": {"type": "integer", "minimum": 1, "description": LONG, "default": 1},
            "room": {"enum": ["single", "double"], "title": "Room", "x-ui": {"widget": "radio"}},
            "title": {"type": "string", "description": "Mr, Ms..."},
            "guests": {
                "type": "array",
                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                "description": LONG,
            },
        },
        "required": ["city", "title"],
        "additionalProperties": False,
    }


def test_a_small_schema_is_kept_whole() -> None:
    schema = {"type": "object", "title": "T", "properties": {"a": {"description": "x"}}}
    assert compact_schema(schema) == schema


def test_a_large_schema_keeps_what_validation_needs() -> None:
    schema = big_schema()
    compact = compact_schema(schema)
    assert len(json.dumps(compact, separators=(",", ":"))) <= SCHEMA_BUDGET
    assert compact["required"] == ["city", "title"]
    assert compact["additionalProperties"] is False
    assert compact["$schema"] == schema["$schema"]
    props = compact["properties"]
    assert list(props) == ["city", "nights", "room", "title", "guests"]
    assert props["nights"]["minimum"] == 1
    assert props["room"] == {"enum": ["single", "double"]}
    assert props["guests"]["items"]["properties"] == {"name": {"type": "string"}}
    assert "title" not in compact
    assert "examples" not in props["city"]
    assert schema == big_schema()  # not changed in place


def test_descriptions_are_shortened_before_they_are_dropped() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            f"p{i}": {"type": "string", "description": f"Field {i}. " + "More detail. " * 4}
            for i in range(8)
        },
    }
    compact = compact_schema(schema)
    assert compact["properties"]["p0"]["description"] == "Field 0."
    much = {**schema, "properties": {f"p{i}": schema["properties"]["p0"] for i in range(40)}}
    assert "description" not in compact_schema(much)["properties"]["p0"]


@st.composite
def schemas_and_values(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """An object schema with long descriptions, and arguments that may or may not fit it."""
    kinds = st.sampled_from(["string", "integer", "boolean", "array"])
    properties: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(WORDS), max_size=6, unique=True)):
        kind = draw(kinds)
        prop: dict[str, Any] = {"type": kind, "description": draw(st.text(max_size=200))}
        if kind == "integer":
            prop["minimum"] = draw(st.integers(-3, 3))
        if kind == "array":
            prop["items"] = {"type": "integer", "title": "n"}
        properties[name] = prop
    schema = {
        "type": "object",
        "properties": properties,
        "required": draw(st.lists(st.sampled_from(sorted(properties) or ["x"]), max_size=3)),
        "additionalProperties": draw(st.booleans()),
        "examples": [draw(st.text(max_size=300))],
    }
    values = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3)
    value = st.lists(values, max_size=2) | values
    arguments = draw(st.dictionaries(st.sampled_from([*properties, "other"]), value, max_size=4))
    return schema, arguments


@settings(deadline=None)
@given(schemas_and_values())
def test_a_compact_schema_accepts_exactly_what_the_original_does(
    case: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    schema, arguments = case
    assert (validate(compact_schema(schema), arguments) == []) == (
        validate(schema, arguments) == []
    )
