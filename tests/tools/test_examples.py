"""The example tools: safe arithmetic, unit conversion, counting, time, capitals, specs."""

from __future__ import annotations

import ast
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.core import InputError, ToolSpec, validate
from turnkeeper.tools._examples import (
    CAPITALS,
    EXAMPLE_TOOLS,
    FINISH,
    UNIT_NAMES,
    calculator,
    capital_of,
    convert,
    convert_units,
    count_text,
    current_time,
    evaluate,
)

# calculator


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2+3", 5),
        ("(2 + 3) * 4", 20),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("10 / 4", 2.5),
        ("-2 ** 2", -4),
        ("2 ** -1", 0.5),
        ("sqrt(16) + abs(-1)", 5.0),
        ("round(2.567, 2)", 2.57),
        ("2 * pi", 2 * math.pi),
        ("log(e)", 1.0),
    ],
)
def test_evaluate_computes_arithmetic(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("__import__('os').system('true')", "is not arithmetic"),
        ("open('/etc/passwd')", "is not arithmetic"),
        ("x + 1", "'x' is not arithmetic"),
        ("(1).__class__", "is not arithmetic"),
        ("[1, 2]", "is not arithmetic"),
        ("1 if 1 else 2", "is not arithmetic"),
        ("lambda: 1", "is not arithmetic"),
        ("'a' * 3", "'a' is not a number"),
        ("True + 1", "True is not a number"),
        ("sqrt(x=4)", "is not arithmetic"),
        ("2 +", "is not an arithmetic expression"),
        ("1\x00", "is not an arithmetic expression"),
        ("", "non-empty"),
        ("1/0", "divides by zero"),
        ("5 % 0", "divides by zero"),
        ("2 ** 5000", "exponents are limited"),
        ("(10 ** 900) ** 900", "more than 1000 digits"),
        ("(-8) ** 0.5", "complex"),
        ("log(0)", "cannot be computed"),
        ("exp(1000)", "cannot be computed"),
        ("abs()", "abs()"),
        ("1" * 501, "longer than 500"),
    ],
)
def test_evaluate_rejects_what_is_not_arithmetic_naming_it(expression: str, problem: str) -> None:
    with pytest.raises(InputError, match=r"^calculator: ") as caught:
        evaluate(expression)
    assert problem in str(caught.value)


def test_evaluate_never_runs_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(InputError, match="is not arithmetic"):
        evaluate(f"__import__('pathlib').Path({str(marker)!r}).touch()")
    assert not marker.exists()


@given(
    st.integers(-(10**6), 10**6),
    st.integers(-(10**6), 10**6),
    st.sampled_from(["+", "-", "*", "//", "%"]),
)
def test_evaluate_agrees_with_python_on_integer_arithmetic(a: int, b: int, op: str) -> None:
    expression = f"({a}) {op} ({b})"
    if op in ("//", "%") and b == 0:
        with pytest.raises(InputError, match="divides by zero"):
            evaluate(expression)
        return
    # The reference value comes from Python's own compiler on a checked expression.
    expected = eval(compile(ast.parse(expression, mode="eval"), "<test>", "eval"))
    assert evaluate(expression) == expected


@given(st.text(max_size=40))
def test_evaluate_raises_only_input_error_on_any_text(text: str) -> None:
    try:
        value = evaluate(text)
    except InputError:
        return
    assert isinstance(value, int | float)


@pytest.mark.anyio
async def test_calculator_returns_text_and_refuses_non_finite_results() -> None:
    assert await calculator("2+3") == "5"
    assert await calculator("1/3") == "0.333333333333"
    with pytest.raises(InputError, match="divides by zero"):
        await calculator("1/0")


# convert_units


@pytest.mark.parametrize(
    ("value", "source", "target", "expected"),
    [
        (1, "km", "m", 1000),
        (1, "mi", "km", 1.609344),
        (12, "in", "ft", 1),
        (1, "lb", "g", 453.59237),
        (100, "C", "F", 212),
        (32, "F", "C", 0),
        (0, "K", "C", -273.15),
        (36, "km/h", "m/s", 10),
        (2, "h", "min", 120),
    ],
)
def test_convert_between_units_of_one_dimension(
    value: float, source: str, target: str, expected: float
) -> None:
    assert convert(value, source, target) == pytest.approx(expected)


@given(st.floats(-1e9, 1e9), st.sampled_from(UNIT_NAMES), st.sampled_from(UNIT_NAMES))
def test_convert_round_trips_or_refuses_unlike_units(value: float, a: str, b: str) -> None:
    temperature = {"C", "K", "F"}
    if (a in temperature) != (b in temperature):
        with pytest.raises(InputError, match="cannot convert"):
            convert(value, a, b)
        return
    try:
        there = convert(value, a, b)
    except InputError:
        # Length to mass and the like: checked by the dimension test below.
        return
    assert convert(there, b, a) == pytest.approx(value, rel=1e-9, abs=1e-6)


def test_convert_names_the_unknown_or_unlike_unit() -> None:
    with pytest.raises(InputError, match=r"unknown unit 'parsec'; the units are mm, cm"):
        convert(1, "parsec", "m")
    with pytest.raises(InputError, match=r"cannot convert kg \(mass\) to m \(length\)"):
        convert(1, "kg", "m")
    with pytest.raises(InputError, match="cannot convert C to m"):
        convert(1, "C", "m")
    with pytest.raises(InputError, match="finite number"):
        convert(math.nan, "m", "km")


@pytest.mark.anyio
async def test_convert_units_says_the_conversion() -> None:
    assert await convert_units(10, "km", "mi") == "10 km = 6.21371 mi"


# count_text, current_time, capital_of


@pytest.mark.anyio
async def test_count_text_counts_characters_words_and_lines() -> None:
    assert await count_text("hello world\nbye") == {
        "characters": 15,
        "characters_without_spaces": 13,
        "words": 3,
        "lines": 2,
    }
    assert await count_text("") == {
        "characters": 0,
        "characters_without_spaces": 0,
        "words": 0,
        "lines": 0,
    }


@pytest.mark.anyio
async def test_current_time_is_utc_iso_8601_between_two_readings() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    shown = datetime.fromisoformat(await current_time())
    after = datetime.now(UTC)
    assert shown.utcoffset() is not None
    assert shown.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert before <= shown <= after


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("country", "capital"),
    [
        ("France", "Paris"),
        ("  the  Netherlands ", "Amsterdam"),
        ("U.S.A.", "Washington, D.C."),
        ("UK", "London"),
        ("JAPAN", "Tokyo"),
    ],
)
async def test_capital_of_looks_up_a_country(country: str, capital: str) -> None:
    assert await capital_of(country) == capital


@pytest.mark.anyio
async def test_capital_of_an_unknown_country_lists_the_known_ones() -> None:
    with pytest.raises(InputError, match=r"no capital known for 'Atlantis'.*France"):
        await capital_of("Atlantis")


def test_capitals_table_keys_are_normalised() -> None:
    assert all(key == " ".join(key.lower().split()) for key in CAPITALS)


# specs


def test_example_tools_are_pairs_of_spec_and_async_function_then_the_terminal_tool() -> None:
    pairs = [item for item in EXAMPLE_TOOLS if isinstance(item, tuple)]
    bare = [item for item in EXAMPLE_TOOLS if isinstance(item, ToolSpec)]
    assert bare == [FINISH]
    assert [spec.name for spec, _ in pairs] == [
        "calculator",
        "convert_units",
        "count_text",
        "current_time",
        "capital_of",
    ]
    for spec, function in pairs:
        assert spec.input_schema["additionalProperties"] is False
        assert set(spec.input_schema["required"]) == set(spec.input_schema["properties"])
        assert function.__name__ == spec.name


@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("calculator", {}, "$: missing required property 'expression'"),
        ("calculator", {"expression": 5}, "$.expression: expected string"),
        ("calculator", {"expression": "1", "x": 1}, "$: unexpected property 'x'"),
        ("convert_units", {"value": 1, "from_unit": "km", "to_unit": "lightyear"}, "to_unit"),
        ("finish", {}, "$: missing required property 'answer'"),
    ],
)
def test_example_schemas_refuse_bad_arguments(
    name: str, arguments: dict[str, Any], problem: str
) -> None:
    specs = {
        (item if isinstance(item, ToolSpec) else item[0]).name: (
            item if isinstance(item, ToolSpec) else item[0]
        )
        for item in EXAMPLE_TOOLS
    }
    errors = validate(specs[name].input_schema, arguments)
    assert any(problem in error for error in errors), errors


def test_example_schemas_accept_good_arguments() -> None:
    calculator_spec = EXAMPLE_TOOLS[0]
    assert isinstance(calculator_spec, tuple)
    assert validate(calculator_spec[0].input_schema, {"expression": "2+3"}) == []
    assert validate(FINISH.input_schema, {"answer": "5"}) == []
