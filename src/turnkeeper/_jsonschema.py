"""A small JSON Schema validator for tool-call arguments.

It covers the subset of drafts 07 and 2020-12 that tool input schemas use and words
every problem as one path-prefixed sentence that a small model can act on, e.g.
`$.city: expected string, got integer`. It never raises: malformed keywords are
ignored, and nesting depth and total work are bounded, so `$ref` cycles and hostile
schemas end in an error message rather than a crash. `format` and unknown keywords are
ignored. Local JSON-pointer `$ref`s (`#`, `#/$defs/x`) are followed, and their sibling
keywords apply too (as in 2020-12); a local `$ref` that leads nowhere is an error, and a
remote one is skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

__all__ = ["MAX_ERRORS", "validate"]

MAX_ERRORS = 20
_MAX_DEPTH = 64
_MAX_STEPS = 100_000
_TYPES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})
_TOO_COMPLEX = "$: validation stopped: the schema or the value is too large or too complex"


def validate(schema: Mapping[str, Any], instance: object) -> list[str]:
    """Check `instance` against `schema`; return up to MAX_ERRORS messages, [] if valid."""
    try:
        return _Run(schema).errors(schema, instance, "$", 0, MAX_ERRORS)
    except _TooComplexError:
        return [_TOO_COMPLEX]


class _TooComplexError(Exception):
    """The step budget ran out (e.g. a `$ref` cycle under `anyOf`, which is exponential)."""


class _Sink:
    """Collects error messages up to a limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[str] = []

    @property
    def full(self) -> bool:
        return len(self.items) >= self.limit

    def add(self, message: str) -> None:
        if not self.full:
            self.items.append(message)


class _Run:
    """One validation: the root schema (for `$ref`) and the work done so far."""

    def __init__(self, root: object) -> None:
        self.root = root
        self.steps = 0

    def errors(self, schema: object, value: object, path: str, depth: int, limit: int) -> list[str]:
        sink = _Sink(limit)
        self.check(schema, value, path, depth, sink)
        return sink.items

    def valid(self, schema: object, value: object, path: str, depth: int) -> bool:
        return not self.errors(schema, value, path, depth, 1)

    def check(self, schema: object, value: object, path: str, depth: int, out: _Sink) -> None:
        self.steps += 1
        if self.steps > _MAX_STEPS:
            raise _TooComplexError
        if out.full or schema is True:
            return
        if schema is False:
            out.add(f"{path}: no value is allowed here")
            return
        if not isinstance(schema, Mapping):
            return
        if depth > _MAX_DEPTH:
            out.add(f"{path}: the value or the schema nests too deeply (is there a $ref cycle?)")
            return
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            target = _resolve(self.root, ref)
            if target is None:
                out.add(f"{path}: the schema's $ref {_show(ref)} cannot be resolved")
            else:
                self.check(target, value, path, depth + 1, out)
        if not self.check_type(schema.get("type"), value, path, out):
            return  # other keywords would only restate the type mismatch
        self.check_value(schema, value, path, out)
        if isinstance(value, int | float) and not isinstance(value, bool):
            for problem in _number_problems(schema, value):
                out.add(f"{path}: {problem}")
        elif isinstance(value, str):
            self.check_string(schema, value, path, out)
        elif isinstance(value, list | tuple):
            self.check_array(schema, value, path, depth, out)
        elif isinstance(value, Mapping):
            self.check_object(schema, value, path, depth, out)
        self.check_logic(schema, value, path, depth, out)

    def check_type(self, expected: object, value: object, path: str, out: _Sink) -> bool:
        names = expected if isinstance(expected, list) else [expected]
        known = [name for name in names if isinstance(name, str) and name in _TYPES]
        if not known or any(_is_type(value, name) for name in known):
            return True
        out.add(f"{path}: expected {' or '.join(known)}, got {_kind(value)}")
        return False

    def check_value(self, schema: Mapping[Any, Any], value: object, path: str, out: _Sink) -> None:
        enum = schema.get("enum")
        if isinstance(enum, list) and _canon(value) not in [_canon(item) for item in enum]:
            out.add(f"{path}: {_show(value)} is not one of {_show(enum, 200)}")
        if "const" in schema and _canon(value) != _canon(schema["const"]):
            out.add(f"{path}: expected {_show(schema['const'])}, got {_show(value)}")

    def check_string(self, schema: Mapping[Any, Any], value: str, path: str, out: _Sink) -> None:
        _check_size(schema, "Length", len(value), "string", ("character", "characters"), path, out)
        raw = schema.get("pattern")
        pattern = _compile(raw) if isinstance(raw, str) else None
        if pattern is not None and not pattern.search(value):
            out.add(f"{path}: {_show(value)} does not match the pattern {_show(raw)}")

    def check_array(
        self,
        schema: Mapping[Any, Any],
        value: list[Any] | tuple[Any, ...],
        path: str,
        depth: int,
        out: _Sink,
    ) -> None:
        _check_size(schema, "Items", len(value), "array", ("item", "items"), path, out)
        prefix, rest = schema.get("prefixItems"), schema.get("items")
        if isinstance(rest, list):  # draft-07 tuple form
            prefix, rest = rest, schema.get("additionalItems")
        prefix = prefix if isinstance(prefix, list) else []
        for index, item in enumerate(value):
            sub = prefix[index] if index < len(prefix) else rest
            self.check(sub, item, f"{path}[{index}]", depth + 1, out)
        if schema.get("uniqueItems") is True:
            seen: dict[object, int] = {}
            for index, item in enumerate(value):
                first = seen.setdefault(_canon(item), index)
                if first != index:
                    out.add(f"{path}: items {first} and {index} are equal, but must be unique")
                    break

    def check_object(
        self,
        schema: Mapping[Any, Any],
        value: Mapping[Any, Any],
        path: str,
        depth: int,
        out: _Sink,
    ) -> None:
        _check_size(
            schema, "Properties", len(value), "object", ("property", "properties"), path, out
        )
        required = schema.get("required")
        for name in required if isinstance(required, list) else []:
            if isinstance(name, str) and name not in value:
                out.add(f"{path}: missing required property '{name}'")
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        raw_patterns = schema.get("patternProperties")
        patterns = [
            (compiled, sub)
            for raw, sub in (raw_patterns.items() if isinstance(raw_patterns, Mapping) else [])
            if isinstance(raw, str) and (compiled := _compile(raw)) is not None
        ]
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            where = _child(path, key)
            matched = key in props
            if matched:
                self.check(props[key], item, where, depth + 1, out)
            for pattern, sub in patterns:
                if isinstance(key, str) and pattern.search(key):
                    matched = True
                    self.check(sub, item, where, depth + 1, out)
            if matched or extra is None:
                continue
            if extra is False:
                allowed = ", ".join(_name(name) for name in props)
                hint = f" (allowed: {allowed})" if allowed else ""
                out.add(f"{path}: unexpected property {_name(key)}{hint}")
            else:
                self.check(extra, item, where, depth + 1, out)

    def check_logic(
        self, schema: Mapping[Any, Any], value: object, path: str, depth: int, out: _Sink
    ) -> None:
        all_of = schema.get("allOf")
        for sub in all_of if isinstance(all_of, list) else []:
            self.check(sub, value, path, depth + 1, out)
        any_of = schema.get("anyOf")
        if isinstance(any_of, list) and any_of:
            failures: list[str] = []
            for sub in any_of:
                errors = self.errors(sub, value, path, depth + 1, 1)
                if not errors:
                    break
                failures.extend(errors)
            else:
                out.add(_none_matched("anyOf", path, failures))
        one_of = schema.get("oneOf")
        if isinstance(one_of, list) and one_of:
            results = [self.errors(sub, value, path, depth + 1, 1) for sub in one_of]
            matches = [number for number, errors in enumerate(results, 1) if not errors]
            if not matches:
                out.add(_none_matched("oneOf", path, [errors[0] for errors in results]))
            elif len(matches) > 1:
                out.add(
                    f"{path}: matches alternatives {matches[0]} and {matches[1]} of oneOf, "
                    "but must match exactly one"
                )
        negated = schema.get("not")
        if isinstance(negated, Mapping | bool) and self.valid(negated, value, path, depth + 1):
            out.add(f"{path}: must not match the schema given in 'not'")
        condition = schema.get("if")
        if isinstance(condition, Mapping | bool):
            holds = self.valid(condition, value, path, depth + 1)
            self.check(schema.get("then" if holds else "else"), value, path, depth + 1, out)


def _kind(value: object) -> str:
    """The JSON type name of a value, as used in messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _is_type(value: object, name: str) -> bool:
    kind = _kind(value)
    if name == "integer":
        return kind == "integer" or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return kind in ("integer", "number")
    return kind == name


def _num(value: object) -> int | float | None:
    """A numeric keyword's value, or None when it is missing or not a number."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _number_problems(schema: Mapping[Any, Any], x: int | float) -> list[str]:
    low, high = _num(schema.get("minimum")), _num(schema.get("maximum"))
    low_ex, high_ex = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if low_ex is True:  # draft 4: a boolean makes `minimum` itself exclusive
        low, low_ex = None, low
    if high_ex is True:
        high, high_ex = None, high
    low_ex, high_ex, step = _num(low_ex), _num(high_ex), _num(schema.get("multipleOf"))
    failed = [
        (low is not None and x < low, "less than the minimum", low),
        (low_ex is not None and x <= low_ex, "less than or equal to the exclusive minimum", low_ex),
        (high is not None and x > high, "greater than the maximum", high),
        (
            high_ex is not None and x >= high_ex,
            "greater than or equal to the exclusive maximum",
            high_ex,
        ),
        (step is not None and step > 0 and not _is_multiple(x, step), "not a multiple of", step),
    ]
    return [f"{_show(x)} is {text} {_show(bound)}" for fails, text, bound in failed if fails]


def _is_multiple(x: int | float, step: int | float) -> bool:
    if isinstance(x, int) and isinstance(step, int):
        return x % step == 0
    try:  # decimal, so that 0.3 is a multiple of 0.1
        exact = [Decimal(v) if isinstance(v, int) else Decimal(repr(v)) for v in (x, step)]
        return bool(exact[0] % exact[1] == 0)
    except ArithmeticError:  # infinite, or beyond decimal precision: too big to judge
        return True


def _check_size(
    schema: Mapping[Any, Any],
    keyword: str,
    size: int,
    what: str,
    unit: tuple[str, str],
    path: str,
    out: _Sink,
) -> None:
    """Apply `min<keyword>` / `max<keyword>` (Length, Items, Properties) to a size."""
    low, high = _num(schema.get("min" + keyword)), _num(schema.get("max" + keyword))
    has = f"{what} has {size} {unit[0] if size == 1 else unit[1]}"
    if low is not None and size < low:
        out.add(f"{path}: {has}, fewer than the minimum {_show(low)}")
    if high is not None and size > high:
        out.add(f"{path}: {has}, more than the maximum {_show(high)}")


def _compile(pattern: str) -> re.Pattern[str] | None:
    """The compiled pattern, or None when Python cannot compile it (it is then ignored)."""
    try:
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError, ValueError):
        return None


def _resolve(root: object, ref: str) -> object | None:
    """Follow a local JSON pointer (`#`, `#/$defs/x`); None when it leads nowhere."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for token in unquote(ref[2:]).split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isascii() and token.isdigit():
            if int(token) >= len(node):
                return None
            node = node[int(token)]
        else:
            return None
    return node


def _canon(value: object, depth: int = 0) -> object:
    """A hashable key equal for JSON-equal values: 1 equals 1.0, but never True."""
    if depth > _MAX_DEPTH:
        return ("deep", id(value))
    if value is None or isinstance(value, bool):
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list | tuple):
        return ("array", tuple(_canon(item, depth + 1) for item in value))
    if isinstance(value, Mapping):
        return (
            "object",
            frozenset((_canon(k, depth + 1), _canon(v, depth + 1)) for k, v in value.items()),
        )
    return ("other", id(value))


def _none_matched(keyword: str, path: str, first_errors: list[str]) -> str:
    head = f"{path}: "
    reasons = "; ".join(
        f"[{number}] {error.removeprefix(head)}" for number, error in enumerate(first_errors, 1)
    )
    return f"{path}: does not match any of the {keyword} alternatives: {reasons}"


def _child(path: str, key: object) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{_show(key)}]"


def _name(key: object) -> str:
    return f"'{key}'" if isinstance(key, str) else _show(key)


def _show(value: object, limit: int = 60) -> str:
    """A value as short JSON for a message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return f"<{_kind(value)}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
