"""parse_tool_calls: every accepted format, prose around calls, unreadable calls, and properties."""

from __future__ import annotations

import json
import keyword
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.providers._parse import ParsedCall, ParsedReply, parse_tool_calls


def call(name: str, **arguments: Any) -> ParsedCall:
    return ParsedCall(name=name, arguments=arguments)


WEATHER = call("get_weather", city="Paris")

# (reply as a model wrote it, expected content, expected calls, expected unreadable)
TABLE: list[tuple[str, str | None, tuple[ParsedCall, ...], bool]] = [
    # Plain prose.
    ("The weather in Paris is sunny.", "The weather in Paris is sunny.", (), False),
    ("", None, (), False),
    ("   \n ", None, (), False),
    # Bare JSON objects, with each name for the arguments.
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None, (WEATHER,), False),
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, (WEATHER,), False),
    ('{"name": "get_weather", "args": {"city": "Paris"}}', None, (WEATHER,), False),
    (
        '{"type": "function", "function": {"name": "get_weather", '
        '"arguments": "{\\"city\\": \\"Paris\\"}"}}',
        None,
        (WEATHER,),
        False,
    ),
    ('{"function": "get_weather", "arguments": {"city": "Paris"}}', None, (WEATHER,), False),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', None, (WEATHER,), False),
    ('{"name": "now", "arguments": null}', None, (call("now"),), False),
    ('{"name": "now", "arguments": ""}', None, (call("now"),), False),
    (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
        None,
        (WEATHER,),
        False,
    ),
    # A bare JSON array of calls.
    (
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "args": {}}]',
        None,
        (WEATHER, call("now")),
        False,
    ),
    # Prose around a call stays as content.
    (
        'Let me check. {"name": "get_weather", "arguments": {"city": "Paris"}} One moment.',
        "Let me check.  One moment.",
        (WEATHER,),
        False,
    ),
    # Braces, brackets, quotes and tags inside argument strings.
    (
        '{"name": "echo", "arguments": {"text": "a {b} [c] \\"}\\" </tool_call> ```"}}',
        None,
        (call("echo", text='a {b} [c] "}" </tool_call> ```'),),
        False,
    ),
    # <tool_call> tags (Hermes, Qwen): several, one holding a list, an unclosed last one.
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        None,
        (WEATHER,),
        False,
    ),
    (
        "I will look both up.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
        "I will look both up.",
        (WEATHER, call("get_weather", city="Rome")),
        False,
    ),
    (
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "now", "arguments": {}}]</tool_call>',
        None,
        (WEATHER, call("now")),
        False,
    ),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}',
        None,
        (WEATHER, call("now")),
        False,
    ),
    (
        '<tool_call>{"name": "now", "arguments": {}}<tool_call>{"name": "now", "arguments": {}}',
        None,
        (call("now"), call("now")),
        False,
    ),
    ('<tool_call>get_weather(city="Paris")</tool_call>', None, (WEATHER,), False),
    # Fenced blocks, with and without a language.
    (
        'Here:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nDone.',
        "Here:\n\nDone.",
        (WEATHER,),
        False,
    ),
    ('```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', None, (WEATHER,), False),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}', None, (WEATHER,), False),
    ('```tool_code\nget_weather(city="Paris")\n```', None, (WEATHER,), False),
    ('```python\n[get_weather(city="Paris")]\n```', None, (WEATHER,), False),
    # Code blocks that are not calls stay content, unflagged.
    ('```json\n{"city": "Paris"}\n```', '```json\n{"city": "Paris"}\n```', (), False),
    ('```python\nprint("hi")\n```', '```python\nprint("hi")\n```', (), False),
    (
        '```bash\n{"name": "x", "arguments": {}}\n```',
        '```bash\n{"name": "x", "arguments": {}}\n```',
        (),
        False,
    ),
    # Pythonic calls (Llama 3.2, Gemma).
    (
        '[get_weather(city="Paris", days=3), now()]',
        None,
        (call("get_weather", city="Paris", days=3), call("now")),
        False,
    ),
    (
        "[search(query='cats', limit=-2, exact=True, tags=['a', 'b'], opts={'x': None})]",
        None,
        (call("search", query="cats", limit=-2, exact=True, tags=["a", "b"], opts={"x": None}),),
        False,
    ),
    ('get_weather(city="Paris")', None, (WEATHER,), False),
    ("now()", None, (call("now"),), False),
    (
        "flags(on=true, off=false, none=null)",
        None,
        (call("flags", on=True, off=False, none=None),),
        False,
    ),
    (
        'Sure: [get_weather(city="Paris")] then I answer.',
        "Sure:  then I answer.",
        (WEATHER,),
        False,
    ),
    ('api.weather.get(city="Paris")', None, (call("api.weather.get", city="Paris"),), False),
    # <|python_tag|> JSON (Llama 3.1), one call or several separated by semicolons.
    (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>',
        None,
        (WEATHER,),
        False,
    ),
    (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "now", "parameters": {}}',
        None,
        (WEATHER, call("now")),
        False,
    ),
    ('<|python_tag|>get_weather(city="Paris")<|eot_id|>', None, (WEATHER,), False),
    # [TOOL_CALLS] (Mistral).
    (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]</s>',
        None,
        (WEATHER,),
        False,
    ),
    # Python literals where JSON was meant (single quotes, True, a trailing comma).
    ("{'name': 'get_weather', 'arguments': {'city': 'Paris'}}", None, (WEATHER,), False),
    ('{"name": "get_weather", "arguments": {"city": "Paris",}}', None, (WEATHER,), False),
    # <think> is dropped first: closed, unclosed, and a lone closing tag.
    (
        '<think>Maybe {"name": "x", "arguments": {}}?</think>\n'
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        None,
        (WEATHER,),
        False,
    ),
    ("<think>The user wants weather</think>It is sunny.", "It is sunny.", (), False),
    ('<think>I should call {"name": "x", "arguments": {}}', None, (), False),
    ("The user greets me.</think>\n\nHello!", "Hello!", (), False),
    # JSON that is not a call stays content, unflagged.
    ('Use {"city": "Paris"} as input.', 'Use {"city": "Paris"} as input.', (), False),
    ('{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', (), False),
    ('[{"city": "Paris"}, {"city": "Rome"}]', '[{"city": "Paris"}, {"city": "Rome"}]', (), False),
    ("See [the docs](https://example.org).", "See [the docs](https://example.org).", (), False),
    ("[x * 2 for x in y]", "[x * 2 for x in y]", (), False),
    # A call after a stray brace is still found.
    (
        '{"oops {"name": "get_weather", "arguments": {"city": "Paris"}}',
        '{"oops',
        (WEATHER,),
        False,
    ),
]

UNREADABLE: list[str] = [
    # Malformed JSON that is clearly a call.
    '{"name": "get_weather", "arguments": {"city": "Paris"}',
    '{"name": "get_weather", "arguments": {"city": Paris}}',
    '{"name": "get_weather" "arguments": {}}',
    # Call-shaped JSON with the wrong types.
    '{"name": 3, "arguments": {}}',
    '{"name": "", "arguments": {}}',
    '{"name": "get_weather", "arguments": [1, 2]}',
    '{"name": "get_weather", "arguments": "not json"}',
    '[{"name": "get_weather", "arguments": {}}, {"city": "Paris"}]',
    # Tags and fences holding something unreadable.
    "<tool_call>get the weather</tool_call>",
    "<tool_call>\n",
    '<tool_call>{"city": "Paris"}</tool_call>',
    "<|python_tag|>weather please",
    '```json\n{"name": "get_weather", "arguments": {,}}\n```',
    "```tool_code\nget_weather('Paris')\n```",
    # Pythonic calls that cannot be read without running code or guessing names.
    'get_weather("Paris")',
    "[get_weather(city=lookup())]",
    '[get_weather(city="Paris", city="Rome")]',
    "[get_weather(**kwargs)]",
    "[get_weather(city=1j)]",
    '[get_weather(city="Paris")',
    "[get_weather(city=float('inf')), 3]",
]


@pytest.mark.parametrize(("reply", "content", "calls", "unreadable"), TABLE)
def test_reads_each_format(
    reply: str, content: str | None, calls: tuple[ParsedCall, ...], unreadable: bool
) -> None:
    assert parse_tool_calls(reply) == ParsedReply(
        content=content, calls=calls, unreadable=unreadable
    )


@pytest.mark.parametrize("reply", UNREADABLE)
def test_unreadable_calls_stay_content_and_are_flagged(reply: str) -> None:
    parsed = parse_tool_calls(reply)
    assert parsed.calls == ()
    assert parsed.unreadable
    assert parsed.content == reply.strip()


def test_readable_and_unreadable_calls_in_one_reply() -> None:
    reply = (
        '<tool_call>{"name": "now", "arguments": {}}</tool_call>\n<tool_call>{broken</tool_call>'
    )
    parsed = parse_tool_calls(reply)
    assert parsed.calls == (call("now"),)
    assert parsed.unreadable
    assert parsed.content == "<tool_call>{broken</tool_call>"


@pytest.mark.parametrize(
    "reply",
    [
        "{" * 200_000,
        '{"' * 100_000,
        "{'" * 100_000,
        '{"name"' * 30_000,
        '[{"a":' * 30_000,
        "[f(" * 60_000,
        "```" * 60_000,
        "<tool_call>" * 20_000,
        "<|python_tag|>{" * 15_000,
        '{"a": "' * 30_000,
        "[" * 200_000,
        '{"a":' + "1" * 10_000 + "}",
        "f(a=" + "-" * 50_000 + "1)",
        "f" + ".a" * 50_000 + "(x=1)",
        '{"name":"f","arguments":' * 5_000,
    ],
    ids=lambda reply: repr(reply[:16]),
)
def test_long_adversarial_text_is_read_as_content(reply: str) -> None:
    # Each of these is quadratic (or worse) for a naive scanner; here they finish.
    parsed = parse_tool_calls(reply)
    assert parsed.calls == ()
    assert parsed.content == reply


def nested_arguments(levels: int) -> str:
    """JSON arguments `levels` objects deep: `{"a": {"a": 1}}` for 2."""
    return '{"a": ' * levels + "1" + "}" * levels


BARE_CALL = '{"name": "f", "arguments": {}}'


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            "<tool_call>" + "[" * 900 + BARE_CALL + "]" * 900 + "</tool_call>", id="in 900 lists"
        ),
        pytest.param(
            "<tool_call>" + '{"tool_calls": [' * 400 + BARE_CALL + "]}" * 400 + "</tool_call>",
            id="in 400 tool_calls",
        ),
        pytest.param(
            "<tool_call>" + "[" * 65 + BARE_CALL + "]" * 65 + "</tool_call>", id="in 65 lists"
        ),
        pytest.param('{"name": "f", "arguments": ' + nested_arguments(65) + "}", id="arguments"),
        pytest.param(
            '{"name": "f", "arguments": ' + json.dumps(nested_arguments(65)) + "}",
            id="arguments as a string",
        ),
        pytest.param("[f(a=" + "[" * 64 + "]" * 64 + ")]", id="pythonic arguments"),
    ],
)
def test_calls_nested_too_deep_are_unreadable(reply: str) -> None:
    assert parse_tool_calls(reply) == ParsedReply(content=reply, calls=(), unreadable=True)


def test_lists_nested_too_deep_in_a_fence_are_not_calls() -> None:
    reply = "```json\n" + "[" * 900 + BARE_CALL + "]" * 900 + "\n```"
    assert parse_tool_calls(reply) == ParsedReply(content=reply, calls=(), unreadable=False)


def test_calls_nested_to_the_limit_are_read() -> None:
    in_lists = "<tool_call>" + "[" * 64 + BARE_CALL + "]" * 64 + "</tool_call>"
    assert parse_tool_calls(in_lists).calls == (call("f"),)
    deepest = nested_arguments(64)
    reply = '{"name": "f", "arguments": ' + deepest + "}"
    assert parse_tool_calls(reply).calls == (ParsedCall("f", json.loads(deepest)),)


def test_calls_after_long_prose_are_found() -> None:
    prose = "word {braces} and [brackets] and (parens) " * 5_000
    parsed = parse_tool_calls(prose + '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert parsed.calls == (WEATHER,)
    assert parsed.content == prose.strip()


FRAGMENTS = [
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    '"',
    "'",
    "\\",
    ",",
    ":",
    ";",
    "=",
    "\n",
    " ",
    '{"name": "f", "arguments": {}}',
    '"name"',
    '"arguments"',
    '"function"',
    '"tool_calls"',
    "f(",
    "a=1",
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "<|eom_id|>",
    "[TOOL_CALLS]",
    "```",
    "```json\n",
    "```tool_code\n",
    "<think>",
    "</think>",
    "true",
    "null",
    "1e999",
    "-",
    "**",
]


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_any_text_parses_without_raising(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.content is None or (parsed.content and parsed.content == parsed.content.strip())
    assert all(isinstance(found.arguments, dict) and found.name for found in parsed.calls)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=30).map("".join))
def test_any_mix_of_call_syntax_parses_without_raising(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.content is None or parsed.content.strip()
    for found in parsed.calls:
        assert isinstance(found.name, str)
        assert found.name
        assert isinstance(found.arguments, dict)
        json.dumps(found.arguments)


# Round trip: calls rendered in each format are read back as the same calls.

IDENTIFIERS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name)
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
CALLS = st.lists(
    st.builds(
        ParsedCall,
        name=IDENTIFIERS,
        arguments=st.dictionaries(IDENTIFIERS, JSON_VALUES, max_size=4),
    ),
    min_size=1,
    max_size=3,
)


def as_json(found: ParsedCall, arguments_key: str = "arguments") -> dict[str, Any]:
    return {"name": found.name, arguments_key: found.arguments}


def render_bare_json(calls: list[ParsedCall]) -> str:
    if len(calls) == 1:
        return json.dumps(as_json(calls[0]))
    return json.dumps([as_json(found, "parameters") for found in calls])


def render_openai_function(calls: list[ParsedCall]) -> str:
    wrapped = [
        {
            "type": "function",
            "function": {"name": found.name, "arguments": json.dumps(found.arguments)},
        }
        for found in calls
    ]
    return json.dumps(wrapped, ensure_ascii=False)


def render_tool_call_tags(calls: list[ParsedCall]) -> str:
    # The last tag is left unclosed, as a model stopped at its end token writes it.
    tags = [f"<tool_call>\n{json.dumps(as_json(found, 'args'))}\n" for found in calls]
    return "</tool_call>\n".join(tags)


def render_fenced_json(calls: list[ParsedCall]) -> str:
    return "```json\n" + json.dumps([as_json(found) for found in calls], indent=2) + "\n```"


def render_bare_fence(calls: list[ParsedCall]) -> str:
    return "```\n" + json.dumps([as_json(found) for found in calls]) + "\n```"


def render_pythonic(calls: list[ParsedCall]) -> str:
    rendered = [
        f"{found.name}({', '.join(f'{key}={value!r}' for key, value in found.arguments.items())})"
        for found in calls
    ]
    return "[" + ", ".join(rendered) + "]"


def render_python_tag(calls: list[ParsedCall]) -> str:
    return "<|python_tag|>" + "; ".join(
        json.dumps(as_json(found, "parameters"), ensure_ascii=False) for found in calls
    )


RENDERERS: list[Callable[[list[ParsedCall]], str]] = [
    render_bare_json,
    render_openai_function,
    render_tool_call_tags,
    render_fenced_json,
    render_bare_fence,
    render_pythonic,
    render_python_tag,
]


@pytest.mark.parametrize("render", RENDERERS, ids=lambda render: render.__name__)
@settings(max_examples=100, deadline=None)
@given(calls=CALLS)
def test_round_trip(render: Callable[[list[ParsedCall]], str], calls: list[ParsedCall]) -> None:
    assert parse_tool_calls(render(calls)) == ParsedReply(
        content=None, calls=tuple(calls), unreadable=False
    )


@pytest.mark.parametrize(
    "render",
    [render_bare_json, render_tool_call_tags, render_fenced_json, render_pythonic],
    ids=lambda render: render.__name__,
)
@settings(max_examples=50, deadline=None)
@given(calls=CALLS)
def test_round_trip_inside_prose(
    render: Callable[[list[ParsedCall]], str], calls: list[ParsedCall]
) -> None:
    reply = "<think>The user asked.</think>I will do that now.\n" + render(calls)
    assert parse_tool_calls(reply) == ParsedReply(
        content="I will do that now.", calls=tuple(calls), unreadable=False
    )


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": "note", "arguments": {"text": "<think>"}}',
        '{"name": "note", "arguments": {"text": "</think> then <think>"}}',
        '<tool_call>{"name": "note", "arguments": {"text": "a <think>b</think>"}}</tool_call>',
        "<think>The user wants a note.</think>\n"
        '{"name": "note", "arguments": {"text": "</think>"}}',
        'Reasoning first.</think>{"name": "note", "arguments": {"text": "<think>"}}',
    ],
)
def test_think_tags_inside_a_call_are_its_text(reply: str) -> None:
    parsed = parse_tool_calls(reply)
    assert not parsed.unreadable
    assert parsed.content is None
    (call,) = parsed.calls
    assert call.name == "note"
    assert call.arguments["text"] in reply


def test_reasoning_blocks_that_start_a_line_are_dropped_with_the_calls_in_them() -> None:
    reply = (
        '<think>\nMaybe {"name": "x", "arguments": {}}\n</think>\nLet me check.\n'
        '<think>Or {"name": "y", "arguments": {}}</think>\n'
        '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    )
    assert parse_tool_calls(reply) == ParsedReply(
        content="Let me check.", calls=(WEATHER,), unreadable=False
    )
