"""Shared data types: tool specs, the agent spec, usage, tool uses and results."""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest

from turnkeeper.events import (
    AgentSpec,
    InputError,
    ToolResult,
    ToolSpec,
    ToolUse,
    TurnkeeperError,
    Usage,
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
    with pytest.raises(InputError, match=r"ToolSpec\.input_schema of 'search'"):
        ToolSpec("search", input_schema=["not", "a", "schema"])  # type: ignore[arg-type]


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
    assert AgentSpec(seed=0, max_tokens=0).sampling() == {"seed": 0, "max_tokens": 0}
    full = AgentSpec(temperature=0.7, top_p=0.9, max_tokens=256, seed=7, stop=("END",))
    assert full.sampling() == {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 256,
        "seed": 7,
        "stop": ["END"],
    }


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
