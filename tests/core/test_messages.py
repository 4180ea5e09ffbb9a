"""Pure helpers over OpenAI-shaped messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core._depth import nests_deeper
from turnkeeper.core._messages import (
    MAX_ARGUMENT_DEPTH,
    call_key,
    canonical_args,
    decode_arguments,
    digest,
    duplicate_content,
    error_content,
    gist,
    key_arguments,
    last_answer,
    text_of,
    tool_message,
    tool_uses_of,
)
from turnkeeper.core._types import ToolUse

TOO_DEEP = (
    f"arguments are nested too deeply (more than {MAX_ARGUMENT_DEPTH} levels of objects and arrays)"
)


def nested_text(levels: int) -> str:
    """JSON text of an object `levels` objects deep: `{"a":{"a":1}}` for 2."""
    return '{"a":' * levels + "1" + "}" * levels


def nested_value(levels: int) -> dict[str, Any]:
    """The value `nested_text(levels)` decodes to, built without recursion."""
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    assert isinstance(value, dict)
    return value


def test_a_dict_of_arguments_is_used_as_is() -> None:
    arguments = {"q": "x"}
    decoded, error = decode_arguments(arguments)
    assert decoded is arguments
    assert error is None


@pytest.mark.parametrize("arguments", [None, "", "  ", "\n\t "])
def test_missing_or_blank_arguments_are_an_empty_object_without_error(arguments: Any) -> None:
    assert decode_arguments(arguments) == ({}, None)


def test_a_json_object_string_decodes() -> None:
    assert decode_arguments('{"q": "ü", "n": [1, {"a": null}]}') == (
        {"q": "ü", "n": [1, {"a": None}]},
        None,
    )
    assert decode_arguments("{}") == ({}, None)


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [("[1, 2]", "list"), ('"text"', "str"), ("42", "int"), ("null", "NoneType"), ("true", "bool")],
)
def test_json_that_is_not_an_object_decodes_to_empty_with_a_reason(
    arguments: str, kind: str
) -> None:
    decoded, error = decode_arguments(arguments)
    assert decoded == {}
    assert error == f"arguments must be a JSON object, got {kind}: {arguments!r}"


@pytest.mark.parametrize("arguments", ['{"q": ', "{'q': 1}", "not json", '{"a": 1} trailing'])
def test_invalid_json_decodes_to_empty_with_a_reason_quoting_it(arguments: str) -> None:
    decoded, error = decode_arguments(arguments)
    assert decoded == {}
    assert error is not None
    assert error.startswith("arguments are not valid JSON (")
    assert error.endswith(repr(arguments))


def test_the_quoted_arguments_are_cut_to_200_characters() -> None:
    _, error = decode_arguments("x" * 5000)
    assert error is not None
    assert error.endswith(repr("x" * 200))


@pytest.mark.parametrize(
    ("arguments", "kind"), [(5, "int"), ([1], "list"), (b"{}", "bytes"), (1.5, "float")]
)
def test_arguments_of_other_types_decode_to_empty_with_a_reason(arguments: Any, kind: str) -> None:
    assert decode_arguments(arguments) == ({}, f"arguments must be a JSON object, got {kind}")


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(nested_text(600), id="objects 600 deep"),
        pytest.param(nested_text(100_000), id="objects 100k deep"),
        pytest.param("[" * 100_000, id="arrays 100k deep, never closed"),
        pytest.param('{"a":' + "[" * 100_000 + "]" * 100_000 + "}", id="arrays 100k deep inside"),
        pytest.param(nested_text(MAX_ARGUMENT_DEPTH + 1), id="one level too deep"),
    ],
)
def test_arguments_nested_too_deep_decode_to_empty_with_a_reason_quoting_them(
    arguments: str,
) -> None:
    assert decode_arguments(arguments) == ({}, f"{TOO_DEEP}: {arguments[:200]!r}")


def test_arguments_nested_to_the_limit_decode() -> None:
    deepest = nested_text(MAX_ARGUMENT_DEPTH)
    assert decode_arguments(deepest) == (nested_value(MAX_ARGUMENT_DEPTH), None)
    # Arrays are levels too.
    arrays = MAX_ARGUMENT_DEPTH - 1
    in_arrays = '{"a":' + "[" * arrays + "]" * arrays + "}"
    assert decode_arguments(in_arrays)[1] is None
    too_deep = '{"a":' + "[" * (arrays + 1) + "]" * (arrays + 1) + "}"
    assert decode_arguments(too_deep) == ({}, f"{TOO_DEEP}: {too_deep!r}")
    # Brackets inside strings are not levels.
    assert decode_arguments(json.dumps({"a": "{[" * 1000})) == ({"a": "{[" * 1000}, None)


def test_a_dict_of_arguments_nested_too_deep_is_refused() -> None:
    deepest = nested_value(MAX_ARGUMENT_DEPTH)
    decoded, error = decode_arguments(deepest)
    assert decoded is deepest
    assert error is None
    assert decode_arguments(nested_value(MAX_ARGUMENT_DEPTH + 1)) == ({}, TOO_DEEP)
    assert decode_arguments(nested_value(100_000)) == ({}, TOO_DEEP)


@pytest.mark.parametrize(
    ("value", "depth"),
    [
        (1, 0),
        ("[[[", 0),
        ({}, 1),
        ([], 1),
        ((), 1),
        ({"a": 1, "b": "x"}, 1),
        ({"a": [1, {"b": ()}]}, 4),
        ([[], [[[]]], {}], 4),
    ],
)
def test_nests_deeper_counts_levels_of_dicts_lists_and_tuples(value: object, depth: int) -> None:
    assert not nests_deeper(value, depth)
    assert depth == 0 or nests_deeper(value, depth - 1)


def test_nests_deeper_stops_past_the_limit_without_recursing() -> None:
    value: list[Any] = []
    for _ in range(100_000):
        value = [value]
    assert nests_deeper(value, MAX_ARGUMENT_DEPTH)
    assert not nests_deeper(value, 100_001)


def test_a_call_with_arguments_nested_too_deep_is_a_bad_call_with_a_key() -> None:
    arguments = "[" * 100_000
    function = {"name": "s", "arguments": arguments}
    message = {"role": "assistant", "tool_calls": [{"id": "a", "function": function}]}
    (use,) = tool_uses_of(message)
    assert use == ToolUse("a", "s", {}, f"{TOO_DEEP}: {arguments[:200]!r}")
    assert call_key(use.name, use.input) == "s\x1f{}"


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.binary(),
        st.integers(),
        st.none(),
        st.lists(st.integers()),
        st.builds(str.__mul__, st.sampled_from(["[", '{"a":', '{"a":["']), st.integers(0, 5000)),
    )
)
def test_decode_arguments_never_raises(arguments: Any) -> None:
    decoded, error = decode_arguments(arguments)
    assert isinstance(decoded, dict)
    assert error is None or decoded == {}


def test_canonical_args_sorts_keys_at_every_depth() -> None:
    arguments = {"b": 1, "a": {"z": [{"y": 1, "x": 2}], "c": None}}
    assert canonical_args(arguments) == '{"a":{"c":null,"z":[{"x":2,"y":1}]},"b":1}'


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), json_values, max_size=5))
def test_equal_dicts_give_equal_canonical_args(arguments: dict[str, Any]) -> None:
    shuffled = dict(reversed(list(arguments.items())))
    assert canonical_args(shuffled) == canonical_args(arguments)
    assert json.loads(canonical_args(arguments)) == arguments


def test_different_arguments_give_different_canonical_args() -> None:
    assert canonical_args({"q": 1}) != canonical_args({"q": "1"})
    assert call_key("search", {"q": 1}) == 'search\x1f{"q":1}'
    assert key_arguments(call_key("a\x1fb", {"q": "\x1f"})) == '{"q":"\\u001f"}'
    assert call_key("search", {"q": 1}) != call_key("fetch", {"q": 1})


def test_arguments_json_cannot_encode_still_give_a_key() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    key = canonical_args({"b": Opaque(), "a": 1})
    assert key == "[('a', 1), ('b', <opaque>)]"
    assert call_key("f", {"b": Opaque(), "a": 1}) == f"f\x1f{key}"


def test_digest_is_stable_and_distinguishes_texts() -> None:
    assert digest("same") == digest("same")
    assert digest("same") != digest("Same")
    assert len(digest("")) == 24
    assert digest("\ud800") == digest("\ud800")


def test_text_of_content_shapes() -> None:
    assert text_of({"role": "user", "content": "hi"}) == "hi"
    assert text_of({"role": "user", "content": ""}) == ""
    parts = [
        {"type": "text", "text": "one "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "two"},
        "stray",
        {"type": "text", "text": 5},
    ]
    assert text_of({"role": "user", "content": parts}) == "one two"
    assert text_of({"role": "user", "content": [{"type": "image_url"}]}) is None
    assert text_of({"role": "assistant", "content": None}) is None
    assert text_of({"role": "assistant"}) is None
    assert text_of({"role": "assistant", "content": 5}) is None


def test_gist_collapses_whitespace() -> None:
    assert gist("  one\n\ttwo   three \n") == "one two three"
    assert gist("") == ""


def test_gist_cuts_long_text_with_an_ellipsis() -> None:
    assert gist("x" * 300) == "x" * 300
    cut = gist("x" * 301)
    assert cut == "x" * 299 + "…"
    assert len(cut) == 300
    assert gist("abcd efgh", limit=6) == "abcd…"
    assert gist("abcdefgh", limit=5) == "abcd…"


def test_tool_and_notice_messages() -> None:
    assert tool_message("c1", "ok") == {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    assert json.loads(error_content('boom "x"')) == {"error": 'boom "x"', "isError": True}
    assert json.loads(duplicate_content("seen")) == {"duplicate": True, "message": "seen"}


def test_last_answer_is_the_text_of_the_last_assistant_message() -> None:
    history = (
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": [{"type": "text", "text": "second"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a result"},
    )
    assert last_answer(history) == "second"
    assert last_answer(history[:3]) == "first"
    assert last_answer(history[:1]) is None
    assert last_answer(()) is None


def test_tool_uses_of_decodes_calls_in_order() -> None:
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "s", "arguments": '{"q":1}'}},
            {"id": "b", "type": "function", "function": {"name": "t", "arguments": "[1]"}},
            {"id": "c", "type": "function", "function": {"name": "u"}},
        ],
    }
    uses = tool_uses_of(message)
    assert uses[0] == ToolUse("a", "s", {"q": 1})
    assert (uses[1].id, uses[1].input) == ("b", {})
    assert uses[1].error == "arguments must be a JSON object, got list: '[1]'"
    assert uses[2] == ToolUse("c", "u", {})
    assert tool_uses_of({"role": "assistant", "content": "hi"}) == ()
    assert tool_uses_of({"role": "assistant", "tool_calls": None}) == ()


@pytest.mark.parametrize(
    "calls",
    [
        {"id": "a"},
        "calls",
        [None],
        [{"id": "a"}],
        [{"id": "a", "function": "f"}],
        [{"function": {"name": "f"}}],
        [{"id": 1, "function": {"name": "f"}}],
        [{"id": "a", "function": {"name": ["f"]}}],
    ],
)
def test_tool_uses_of_malformed_calls_is_a_type_error(calls: Any) -> None:
    with pytest.raises(TypeError, match="tool_calls"):
        tool_uses_of({"role": "assistant", "tool_calls": calls})
