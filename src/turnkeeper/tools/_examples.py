"""Example tools, so a first `turnkeeper run` does something real: arithmetic, unit
conversion, counting text, the current UTC time, capitals of countries, and `finish`.

`EXAMPLE_TOOLS` is in the shape `turnkeeper run --tools module:object` loads: a list of
`(ToolSpec, async function)` pairs plus one bare ToolSpec, the terminal tool.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from turnkeeper.core import InputError, ToolSpec

_MAX_EXPRESSION = 500  # characters
_MAX_EXPONENT = 1000
_MAX_DIGITS = 1000  # of an integer result, so `9**999**...` cannot eat the machine
_MAX_BITS = _MAX_DIGITS * 10 // 3 + 4

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}
_ALLOWED = (
    "numbers, + - * / // % **, parentheses, "
    f"{', '.join(_CONSTANTS)} and {', '.join(f'{name}()' for name in _FUNCTIONS)}"
)


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, computed from its syntax tree (never `eval`).

    Raises InputError naming what is not arithmetic, or what cannot be computed.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise InputError("calculator: expression must be a non-empty string")
    if len(expression) > _MAX_EXPRESSION:
        raise InputError(f"calculator: expression is longer than {_MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        why = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise InputError(
            f"calculator: {expression!r} is not an arithmetic expression ({why})"
        ) from None
    except (RecursionError, MemoryError):
        raise InputError(f"calculator: {expression!r} is nested too deeply") from None
    try:
        return _value(tree.body)
    except InputError:
        raise
    except ZeroDivisionError:
        raise InputError(f"calculator: {expression!r} divides by zero") from None
    except (ArithmeticError, ValueError) as exc:
        raise InputError(f"calculator: {expression!r} cannot be computed ({exc})") from None
    except RecursionError:
        raise InputError(f"calculator: {expression!r} is nested too deeply") from None


def _value(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise InputError(f"calculator: {node.value!r} is not a number; allowed: {_ALLOWED}")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        arguments = [_value(argument) for argument in node.args]
        try:
            return _checked(_FUNCTIONS[node.func.id](*arguments))
        except TypeError as exc:
            raise InputError(f"calculator: {node.func.id}(): {exc}") from None
    shown = ast.unparse(node)
    raise InputError(f"calculator: {shown!r} is not arithmetic; allowed: {_ALLOWED}")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > _MAX_EXPONENT:
        raise InputError(f"calculator: exponents are limited to ±{_MAX_EXPONENT}")
    # Checked before computing: an integer power is exact, so it could take minutes.
    if isinstance(base, int) and abs(base).bit_length() * exponent > _MAX_BITS:
        raise InputError(f"calculator: the result has more than {_MAX_DIGITS} digits")


def _checked(value: Any) -> int | float:
    if isinstance(value, complex):
        raise InputError("calculator: the result is a complex number")
    if isinstance(value, int) and abs(value).bit_length() > _MAX_BITS:
        raise InputError(f"calculator: the result has more than {_MAX_DIGITS} digits")
    if not isinstance(value, int | float):
        raise InputError(f"calculator: the result {value!r} is not a number")
    return value


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    value = evaluate(expression)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"calculator: {expression!r} has no finite value")
        return f"{value:.12g}"
    return str(value)


# Each unit: (dimension, how many of the dimension's base unit one of it is).
_UNITS: dict[str, tuple[str, float]] = {
    "mm": ("length", 0.001),
    "cm": ("length", 0.01),
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "in": ("length", 0.0254),
    "ft": ("length", 0.3048),
    "yd": ("length", 0.9144),
    "mi": ("length", 1609.344),
    "mg": ("mass", 1e-6),
    "g": ("mass", 0.001),
    "kg": ("mass", 1.0),
    "t": ("mass", 1000.0),
    "oz": ("mass", 0.028349523125),
    "lb": ("mass", 0.45359237),
    "ml": ("volume", 0.001),
    "l": ("volume", 1.0),
    "gal": ("volume", 3.785411784),
    "s": ("time", 1.0),
    "min": ("time", 60.0),
    "h": ("time", 3600.0),
    "day": ("time", 86400.0),
    "km/h": ("speed", 1 / 3.6),
    "m/s": ("speed", 1.0),
    "mph": ("speed", 0.44704),
}
# Temperatures are affine: kelvin = (value + offset) * scale.
_TEMPERATURES: dict[str, tuple[float, float]] = {
    "C": (273.15, 1.0),
    "K": (0.0, 1.0),
    "F": (459.67, 5 / 9),
}
UNIT_NAMES: tuple[str, ...] = (*_UNITS, *_TEMPERATURES)


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """`value` in `from_unit`, expressed in `to_unit`; InputError for unknown or unlike units."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"convert_units: value must be a finite number, got {value!r}")
    for unit in (from_unit, to_unit):
        if unit not in UNIT_NAMES:
            raise InputError(
                f"convert_units: unknown unit {unit!r}; the units are {', '.join(UNIT_NAMES)}"
            )
    if from_unit in _TEMPERATURES or to_unit in _TEMPERATURES:
        if not (from_unit in _TEMPERATURES and to_unit in _TEMPERATURES):
            raise InputError(f"convert_units: cannot convert {from_unit} to {to_unit}")
        offset, scale = _TEMPERATURES[from_unit]
        kelvin = (value + offset) * scale
        offset, scale = _TEMPERATURES[to_unit]
        return kelvin / scale - offset
    (source, factor), (target, divisor) = _UNITS[from_unit], _UNITS[to_unit]
    if source != target:
        raise InputError(
            f"convert_units: cannot convert {from_unit} ({source}) to {to_unit} ({target})"
        )
    return value * factor / divisor


async def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a quantity between units."""
    return f"{value:g} {from_unit} = {convert(value, from_unit, to_unit):.6g} {to_unit}"


async def count_text(text: str) -> dict[str, int]:
    """Count the characters, words and lines of a text."""
    return {
        "characters": len(text),
        "characters_without_spaces": sum(not character.isspace() for character in text),
        "words": len(text.split()),
        "lines": len(text.splitlines()),
    }


async def current_time() -> str:
    """The current date and time in UTC, ISO 8601."""
    return datetime.now(UTC).isoformat(timespec="seconds")


CAPITALS: dict[str, str] = {
    "argentina": "Buenos Aires",
    "australia": "Canberra",
    "austria": "Vienna",
    "belgium": "Brussels",
    "brazil": "Brasília",
    "canada": "Ottawa",
    "chile": "Santiago",
    "china": "Beijing",
    "colombia": "Bogotá",
    "czechia": "Prague",
    "denmark": "Copenhagen",
    "egypt": "Cairo",
    "ethiopia": "Addis Ababa",
    "finland": "Helsinki",
    "france": "Paris",
    "germany": "Berlin",
    "ghana": "Accra",
    "greece": "Athens",
    "hungary": "Budapest",
    "india": "New Delhi",
    "indonesia": "Jakarta",
    "ireland": "Dublin",
    "italy": "Rome",
    "japan": "Tokyo",
    "kenya": "Nairobi",
    "mexico": "Mexico City",
    "morocco": "Rabat",
    "netherlands": "Amsterdam",
    "new zealand": "Wellington",
    "nigeria": "Abuja",
    "norway": "Oslo",
    "peru": "Lima",
    "philippines": "Manila",
    "poland": "Warsaw",
    "portugal": "Lisbon",
    "south africa": "Pretoria",
    "south korea": "Seoul",
    "spain": "Madrid",
    "sweden": "Stockholm",
    "switzerland": "Bern",
    "thailand": "Bangkok",
    "turkey": "Ankara",
    "ukraine": "Kyiv",
    "united kingdom": "London",
    "united states": "Washington, D.C.",
    "vietnam": "Hanoi",
}
_ALIASES = {
    "uk": "united kingdom",
    "great britain": "united kingdom",
    "england": "united kingdom",
    "usa": "united states",
    "us": "united states",
    "united states of america": "united states",
    "america": "united states",
    "czech republic": "czechia",
    "korea": "south korea",
    "holland": "netherlands",
    "türkiye": "turkey",
}


async def capital_of(country: str) -> str:
    """The capital city of a country, from a built-in table."""
    key = " ".join(country.lower().replace(".", "").split())
    key = key.removeprefix("the ")
    key = _ALIASES.get(key, key)
    capital = CAPITALS.get(key)
    if capital is None:
        raise InputError(
            f"capital_of: no capital known for {country!r}; the table covers "
            f"{', '.join(name.title() for name in CAPITALS)}"
        )
    return capital


def _spec(name: str, description: str, properties: dict[str, Any]) -> ToolSpec:
    return ToolSpec(
        name,
        description,
        {
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        },
    )


CALCULATOR = _spec(
    "calculator",
    "Evaluate an arithmetic expression exactly, e.g. '(2 + 3) * 4' or 'sqrt(2) ** 3'. "
    f"Allowed: {_ALLOWED}.",
    {
        "expression": {
            "type": "string",
            "minLength": 1,
            "maxLength": _MAX_EXPRESSION,
            "description": "The expression, e.g. '2 + 3'.",
        }
    },
)
CONVERT_UNITS = _spec(
    "convert_units",
    "Convert a quantity between units of length, mass, volume, time, speed or temperature.",
    {
        "value": {"type": "number", "description": "The quantity to convert."},
        "from_unit": {"type": "string", "enum": list(UNIT_NAMES)},
        "to_unit": {"type": "string", "enum": list(UNIT_NAMES)},
    },
)
COUNT_TEXT = _spec(
    "count_text",
    "Count the characters, words and lines of a text.",
    {"text": {"type": "string", "description": "The text to count."}},
)
CURRENT_TIME = _spec("current_time", "The current date and time in UTC (ISO 8601).", {})
CAPITAL_OF = _spec(
    "capital_of",
    "The capital city of a country, e.g. 'France' -> 'Paris'.",
    {"country": {"type": "string", "minLength": 1, "description": "The country's name."}},
)
FINISH = _spec(
    "finish",
    "Give your final answer and end the task.",
    {"answer": {"type": "string", "description": "The final answer for the user."}},
)

EXAMPLE_TOOLS: tuple[ToolSpec | tuple[ToolSpec, Callable[..., Awaitable[Any]]], ...] = (
    (CALCULATOR, calculator),
    (CONVERT_UNITS, convert_units),
    (COUNT_TEXT, count_text),
    (CURRENT_TIME, current_time),
    (CAPITAL_OF, capital_of),
    FINISH,
)
"""The example tools, each with its function, and `finish`, the terminal tool."""
