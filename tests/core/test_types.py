"""Shared data types: tool specs, the agent spec, usage, tool uses and results."""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from turnkeeper.core._errors import InputError, TurnkeeperError
from turnkeeper.core._types import (
    AgentSpec,
    McpServer,
    ToolResult,
    ToolSpec,
    ToolUse,
    Usage,
    check_spec,
    check_tool,
)


@pytest.mark.parametrize("name", ["search", "a", "a" * 64, "web.search", "get-page_2", "A.B-c_9"])
def test_valid_tool_names(name: str) -> None:
    assert ToolSpec(name).name == name


@pytest.mark.parametrize(
    "name", ["", " ", "has space", "a" * 65, "tab\tname", "new\nline", "ünï", "a/b", "a:b"]
)
def test_invalid_tool_names_raise_input_error_naming_them(name: str) -> None:
    with pytest.raises(InputError) as caught:
        ToolSpec(name)
    assert f"ToolSpec.name: {name!r} must be 1 to 64" in str(caught.value)
    assert isinstance(caught.value, TurnkeeperError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("name", [None, 5, b"search"])
def test_a_tool_name_that_is_not_a_string_raises_input_error(name: Any) -> None:
    with pytest.raises(InputError, match=r"^ToolSpec\.name: "):
        ToolSpec(name)


def test_a_tool_schema_must_be_an_object() -> None:
    with pytest.raises(InputError, match=r"^ToolSpec\.input_schema: the schema of tool 'search'"):
        ToolSpec("search", input_schema=["not", "a", "schema"])  # type: ignore[arg-type]


DRAFT_07 = "http://json-schema.org/draft-07/schema#"
UNUSABLE_SCHEMAS: list[tuple[dict[str, Any], str]] = [
    ({"type": 5}, "invalid (at $.type: "),
    ({"type": "string", "pattern": "("}, "invalid (at $.pattern: "),
    ({"properties": {"a": {"type": "strin"}}}, "invalid (at $.properties.a.type: "),
    ({"type": "object", "default": {1, 2}}, "not JSON"),
    ({"$ref": "#"}, '$: the schema\'s $ref "#" leads back to itself'),
    ({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, '$.anyOf[1]: the schema\'s $ref "#" leads'),
    ({"properties": {"a": {"$ref": "#/properties/a"}}}, "$.properties.a: the schema's $ref"),
    (
        {
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
            "properties": {"x": {"$ref": "#/$defs/a"}},
        },
        "leads back to itself without going into the value",
    ),
    ({"properties": {"a": {"$ref": "#/$defs/nope"}}}, "$.properties.a: the schema's $ref \"#/$"),
    ({"$ref": "https://example.com/schema.json"}, "cannot be resolved"),
    # Draft-07's meta-schema does not look into `$defs`, but its $ref leads there.
    (
        {"$schema": DRAFT_07, "$ref": "#/$defs/a", "$defs": {"a": {"$ref": {"x": 1}}}},
        "the schema's $ref is object, not a string",
    ),
]


@pytest.mark.parametrize(("schema", "problem"), UNUSABLE_SCHEMAS)
def test_a_schema_arguments_cannot_be_checked_against_is_refused_naming_the_tool(
    schema: dict[str, Any], problem: str
) -> None:
    spec = AgentSpec(tools=(ToolSpec("ok"), ToolSpec("lookup", input_schema=schema)))
    with pytest.raises(InputError) as caught:
        check_spec(spec)
    message = str(caught.value)
    assert message.startswith(
        "spec.tools[1].input_schema: the schema of tool 'lookup' cannot be used: "
    )
    assert problem in message
    with pytest.raises(InputError, match=r"^ToolSpec\.input_schema: the schema of tool 'lookup'"):
        check_tool(spec.tools[1], "ToolSpec")


@pytest.mark.parametrize(
    ("schema", "problem"), [case for case in UNUSABLE_SCHEMAS if "not JSON" not in case[1]]
)
def test_an_unusable_schema_decodes_as_logged(schema: dict[str, Any], problem: str) -> None:
    raw = {"tools": [{"name": "ok"}, {"name": "lookup", "input_schema": schema}]}
    spec = msgspec.json.decode(msgspec.json.encode(raw), type=AgentSpec)
    assert spec.tools[1].input_schema == schema
    with pytest.raises(InputError, match=r"^spec\.tools\[1\]\.input_schema: ") as caught:
        check_spec(spec)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"child": {"$ref": "#"}}},
        {
            "$defs": {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
            "properties": {"t": {"$ref": "#/$defs/tree"}},
        },
        {"$defs": {"unused": {"$ref": "#/nowhere"}}},
        {"$ref": "https://json-schema.org/draft/2020-12/schema"},
        {"$dynamicAnchor": "node", "properties": {"kids": {"items": {"$dynamicRef": "#node"}}}},
        {
            "$schema": DRAFT_07,
            "definitions": {"n": {"items": {"$ref": "#/definitions/n"}}},
            "$ref": "#/definitions/n",
        },
        # Up to draft-07 the keywords beside a $ref are ignored, so this $ref is never followed.
        {
            "$schema": DRAFT_07,
            "$ref": "#/definitions/n",
            "definitions": {"n": {}},
            "properties": {"a": {"$ref": "#/nowhere"}},
        },
        {
            "$id": "https://example.com/root.json",
            "$defs": {
                "c": {"$id": "child.json", "$defs": {"d": {"type": "string"}}, "$ref": "#/$defs/d"}
            },
            "properties": {"a": {"$ref": "child.json"}},
        },
    ],
)
def test_recursive_and_self_contained_schemas_are_accepted(schema: dict[str, Any]) -> None:
    tool = ToolSpec("lookup", input_schema=schema)
    check_spec(AgentSpec(tools=(tool,)))
    assert tool.input_schema == schema


def test_tool_spec_defaults_and_openai_shape() -> None:
    plain = ToolSpec("search")
    assert (plain.description, plain.repeatable) == ("", False)
    assert plain.input_schema == {"type": "object", "properties": {}}
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    assert ToolSpec("search", "Find things", schema).to_openai() == {
        "type": "function",
        "function": {"name": "search", "description": "Find things", "parameters": schema},
    }


def test_default_schemas_are_not_shared() -> None:
    first, second = ToolSpec("a"), ToolSpec("b")
    first.input_schema["properties"]["x"] = {}
    assert second.input_schema == {"type": "object", "properties": {}}


def test_a_tool_spec_decoded_from_json_is_validated() -> None:
    assert msgspec.json.decode(b'{"name": "ok"}', type=ToolSpec) == ToolSpec("ok")
    with pytest.raises(msgspec.ValidationError, match="must be 1 to 64"):
        msgspec.json.decode(b'{"name": "not ok"}', type=ToolSpec)


def test_duplicate_tool_names_raise_input_error_naming_the_tool() -> None:
    tools = (ToolSpec("search"), ToolSpec("fetch"), ToolSpec("search", "again"))
    with pytest.raises(InputError) as caught:
        AgentSpec(tools=tools)
    assert str(caught.value) == "AgentSpec.tools: tool 'search' is listed twice"


def test_an_unknown_terminal_tool_raises_input_error_naming_it() -> None:
    with pytest.raises(InputError) as caught:
        AgentSpec(tools=(ToolSpec("search"), ToolSpec("fetch")), terminal_tool="finish")
    assert str(caught.value) == (
        "AgentSpec.terminal_tool: 'finish' is not one of the tools (search, fetch)"
    )
    with pytest.raises(InputError, match=r"'finish' is not one of the tools \(none given\)"):
        AgentSpec(terminal_tool="finish")


def test_tools_and_stop_given_as_lists_become_tuples() -> None:
    spec = AgentSpec(
        tools=[ToolSpec("search"), ToolSpec("finish")],  # type: ignore[arg-type]
        terminal_tool="finish",
        stop=["END", "STOP"],  # type: ignore[arg-type]
    )
    assert spec.tools == (ToolSpec("search"), ToolSpec("finish"))
    assert isinstance(spec.tools, tuple)
    assert spec.stop == ("END", "STOP")
    assert spec == AgentSpec(tools=spec.tools, terminal_tool="finish", stop=spec.stop)


def test_a_spec_looks_up_its_tools_by_name() -> None:
    search = ToolSpec("search", "Find")
    spec = AgentSpec(tools=(search, ToolSpec("fetch")))
    assert spec.tool("search") is search
    assert spec.tool("missing") is None


def test_sampling_holds_only_the_params_that_are_set() -> None:
    assert AgentSpec().sampling() == {}
    assert AgentSpec(temperature=0.0).sampling() == {"temperature": 0.0}
    assert AgentSpec(seed=0, max_tokens=1).sampling() == {"seed": 0, "max_tokens": 1}
    full = AgentSpec(temperature=0.7, top_p=0.9, max_tokens=256, seed=7, stop=("END",))
    assert full.sampling() == {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 256,
        "seed": 7,
        "stop": ["END"],
    }


SAMPLING_REFUSED: list[tuple[str, Any]] = [
    ("temperature", -5),
    ("temperature", -0.01),
    ("temperature", 2.01),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", True),
    ("temperature", "0.5"),
    ("top_p", 0),
    ("top_p", -0.5),
    ("top_p", 1.5),
    ("top_p", math.nan),
    ("top_p", False),
    ("max_tokens", 0),
    ("max_tokens", -1),
    ("max_tokens", 1.5),
    ("max_tokens", True),
    ("seed", 2**63),
    ("seed", -(2**63) - 1),
    ("seed", 1.5),
    ("seed", True),
]
# Out of range, but of the type a log holds: what a log written before the ranges may hold.
SAMPLING_LOGGED: list[tuple[str, Any]] = [
    ("temperature", -5),
    ("temperature", 2.01),
    ("top_p", 0),
    ("top_p", 1.5),
    ("max_tokens", 0),
    ("max_tokens", -1),
    ("seed", 2**63),
]


@pytest.mark.parametrize(("field", "value"), SAMPLING_REFUSED)
def test_a_sampling_param_out_of_range_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(InputError, match=rf"^spec\.{field}: expected "):
        check_spec(AgentSpec(**{field: value}))


@pytest.mark.parametrize(("field", "value"), SAMPLING_LOGGED)
def test_a_sampling_param_out_of_range_decodes_as_logged(field: str, value: Any) -> None:
    spec = msgspec.json.decode(msgspec.json.encode({field: value}), type=AgentSpec)
    assert getattr(spec, field) == value
    with pytest.raises(InputError, match=rf"^spec\.{field}: expected "):
        check_spec(spec)


@pytest.mark.parametrize("stop", ["END", (1,), 5])
def test_a_stop_that_is_not_a_list_of_strings_is_refused(stop: Any) -> None:
    with pytest.raises(InputError, match=r"^AgentSpec\.stop: expected a list of strings"):
        AgentSpec(stop=stop)


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0, "top_p": 1, "max_tokens": 1, "seed": -(2**63)},
        {"temperature": 2.0, "top_p": 1e-9, "seed": 2**63 - 1, "stop": ()},
        {"temperature": 1, "stop": ("", "END")},
    ],
)
def test_sampling_params_at_the_ends_of_their_ranges_are_accepted(sampling: dict[str, Any]) -> None:
    spec = AgentSpec(**sampling)
    check_spec(spec)
    assert spec.sampling() == {
        key: list(value) if key == "stop" else value for key, value in sampling.items()
    }
    assert msgspec.json.decode(msgspec.json.encode(spec), type=AgentSpec) == spec


def test_agent_spec_defaults() -> None:
    spec = AgentSpec()
    assert (spec.system_prompt, spec.tools, spec.terminal_tool, spec.model) == (
        "",
        (),
        None,
        "default",
    )


def test_agent_spec_round_trips_through_json() -> None:
    spec = AgentSpec(
        system_prompt="Be brief.",
        tools=(ToolSpec("search", repeatable=True), ToolSpec("finish")),
        terminal_tool="finish",
        temperature=0.1,
        stop=("END",),
    )
    assert msgspec.json.decode(msgspec.json.encode(spec), type=AgentSpec) == spec


def test_usage_adds_up_and_totals() -> None:
    assert Usage() == Usage(0, 0)
    assert Usage().total_tokens == 0
    total = Usage(10, 2) + Usage(5, 1)
    assert total == Usage(prompt_tokens=15, completion_tokens=3)
    assert total.total_tokens == 18
    assert Usage(3, 4) + Usage() == Usage(3, 4)
    assert sum((Usage(1, 1) for _ in range(4)), Usage()) == Usage(4, 4)


def test_tool_use_and_result_defaults() -> None:
    assert ToolUse("c1", "search", {"q": "x"}).error is None
    assert ToolResult("c1", "found").is_error is False
    assert ToolResult("c1", "boom", is_error=True) == ToolResult("c1", "boom", True)


def test_data_types_are_frozen() -> None:
    values: list[Any] = [
        ToolSpec("a"),
        AgentSpec(),
        Usage(),
        ToolUse("c1", "a", {}),
        ToolResult("c1", "x"),
    ]
    for value in values:
        field = value.__struct_fields__[0]
        with pytest.raises(AttributeError):
            setattr(value, field, getattr(value, field))


def test_tool_uses_are_left_to_reference_counting() -> None:
    use = ToolUse("c1", "search", {"q": ["a", "b"]})
    assert not gc.is_tracked(use)
    # A tuple of them is untracked by the collector's first look at it.
    pending = (use,)
    gc.collect()
    assert not gc.is_tracked(pending)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (lambda: AgentSpec(tools=(ToolSpec("add\n"),)), "spec.tools[0].name"),
        (
            lambda: AgentSpec(mcp_servers=(McpServer("files\n", command="python"),)),
            "spec.mcp_servers[0].name",
        ),
        (
            lambda: AgentSpec(
                mcp_servers=(McpServer("files", command="python", tool_prefix="fs_\n"),)
            ),
            "spec.mcp_servers[0].tool_prefix",
        ),
    ],
)
def test_a_name_ending_in_a_newline_is_refused_for_new_input_naming_it(
    spec: Callable[[], AgentSpec], field: str
) -> None:
    # Decoding lets it through (a log holding one still reads); check_spec, run on new
    # input, refuses it as a chat server would.
    with pytest.raises(InputError, match=re.escape(field)):
        check_spec(spec())
