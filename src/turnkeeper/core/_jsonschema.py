"""Tool-argument checks against a JSON Schema: validation by the `jsonschema` library, worded
for a small model, and the safe coercions applied before it.

A schema is checked with the dialect its `$schema` names; without one (or with one the
library does not know), as Draft 2020-12, else as draft-07 when only draft-07 accepts it
(`items` as a list, `additionalItems`, `dependencies`). Compiled validators are cached per
schema. `format` is not asserted, but for an answer's check (`formats=True`), where the
formats msgspec writes in its types' schemas are asserted as msgspec decodes them (`date`,
`date-time`, `time`, `duration`, `uuid`, `decimal`), so that a value that passes decodes
into the type. `$ref`s are resolved within the schema only: nothing is
ever fetched, and a `$ref` that leads nowhere is an error message. `schema_problem` says up
front whether a schema can be used at all; one that cannot (a `$ref` in a circle, say) is
not run at all, nor a value nested more than 64 levels deep: deep enough, the library's
recursion fails inside its Rust-backed registry, where a RecursionError turns into a
panic that no `except Exception` catches.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, cast

import msgspec
import referencing
import referencing.jsonschema
from jsonschema import (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
    FormatChecker,
)
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import extend
from referencing.exceptions import Unresolvable

from turnkeeper.core._depth import nests_deeper
from turnkeeper.core._simple_schema import Check, compile_simple

if TYPE_CHECKING:
    # `referencing` exports no public name for the resolver type its registries return.
    from referencing._core import Resolver

__all__ = ["MAX_ERRORS", "coerce", "schema_problem", "validate"]

MAX_ERRORS = 20
_MAX_DEPTH = 64  # of `$ref` hops and nesting that `coerce` follows, and of a value checked
_TOO_DEEP = "$: validation stopped: the schema or the value nests too deeply"


def _exact_multiple_of(cls: type[Validator]) -> type[Validator]:
    """`cls` with `multipleOf` exact for decimal steps: the library divides floats, so
    19.99 is not a multiple of 0.01 there; in decimal it is, as the model meant."""
    library = cls.VALIDATORS["multipleOf"]

    def multiple_of(
        validator: Validator, step: object, instance: object, schema: object
    ) -> Iterator[ValidationError]:
        if (
            isinstance(step, float)
            and isinstance(instance, int | float)
            and not isinstance(instance, bool)
        ):
            try:
                exact = [
                    Decimal(x) if isinstance(x, int) else Decimal(repr(x)) for x in (instance, step)
                ]
                if exact[1] and exact[0] % exact[1] == 0:
                    return
            except (ArithmeticError, ValueError):  # beyond decimal precision: the library judges
                pass
        yield from library(validator, step, instance, schema)

    extended: type[Validator] = extend(cls, {"multipleOf": multiple_of})  # type: ignore[no-untyped-call]
    return extended


_DIALECTS: dict[str, type[Validator]] = {
    str(cls.META_SCHEMA.get("$id", cls.META_SCHEMA.get("id"))).rstrip("#"): _exact_multiple_of(cls)
    for cls in (
        Draft4Validator,
        Draft6Validator,
        Draft7Validator,
        Draft201909Validator,
        Draft202012Validator,
    )
}
# Draft 4 alone does not count 1.0 as an integer, so its schemas get no simple check.
_DRAFT4_TYPES = Draft4Validator.TYPE_CHECKER
_UNDECLARED = (
    _DIALECTS[Draft202012Validator.META_SCHEMA["$id"].rstrip("#")],
    _DIALECTS[Draft7Validator.META_SCHEMA["$id"].rstrip("#")],
)
# No `retrieve`: a remote `$ref` is unresolvable rather than fetched over the network.
_OFFLINE: referencing.Registry[Any] = referencing.Registry()
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,300})(?:\.0+)?")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]{0,300})(?:\.[0-9]{1,300})?(?:[eE][+-]?[0-9]{1,3})?")
_META_SCHEMAS = ("https://json-schema.org/", "http://json-schema.org/")
_REFS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose subschemas check the same value as their schema does, so a $ref cycle
# through them alone never ends; and those whose subschemas check a part of the value.
_IN_PLACE = (
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependencies",  # draft-07's: subschemas, or lists of property names
)
_INTO_VALUE = (
    "properties",
    "patternProperties",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "dependencies")
# Up to draft-07, keywords beside a `$ref` are ignored.
_REF_ALONE = frozenset(
    _DIALECTS[str(cls.META_SCHEMA.get("$id", cls.META_SCHEMA.get("id"))).rstrip("#")]
    for cls in (Draft4Validator, Draft6Validator, Draft7Validator)
)


def _decodes(kind: Any) -> Callable[[object], bool]:
    """Whether a string decodes as `kind` in msgspec (a format applies to strings only)."""

    def check(value: object) -> bool:
        if not isinstance(value, str):
            return True
        try:
            msgspec.convert(value, kind)
        except msgspec.ValidationError:
            return False
        return True

    return check


_FORMATS = FormatChecker(formats=())
_MSGSPEC_FORMATS: dict[str, Any] = {
    "date": datetime.date,
    # msgspec writes these formats only for values with a time zone.
    "date-time": Annotated[datetime.datetime, msgspec.Meta(tz=True)],
    "time": Annotated[datetime.time, msgspec.Meta(tz=True)],
    "duration": datetime.timedelta,
    "uuid": uuid.UUID,
    "decimal": Decimal,
}
for _format, _decoded in _MSGSPEC_FORMATS.items():
    _FORMATS.checks(_format)(_decodes(_decoded))


class _Checker:
    """A compiled schema: its validator, a resolver for following its `$ref`s, and a fast
    exact check when the schema is simple enough for one."""

    def __init__(
        self,
        validator: Validator,
        resolver: Resolver[Any],
        simple: Check | None,
        problem: str | None,
    ) -> None:
        self.validator = validator
        self.resolver = resolver
        self.simple = simple
        self.problem = problem

    def is_valid(self, instance: object) -> bool:
        if self.simple is not None:
            return self.simple(instance)
        if self.problem is not None or nests_deeper(instance, _MAX_DEPTH):
            return False
        return bool(self.validator.is_valid(cast(Any, instance)))


def validate(schema: Mapping[str, Any], instance: object, *, formats: bool = False) -> list[str]:
    """Check `instance` against `schema`; return up to MAX_ERRORS messages, [] if valid.
    With `formats`, msgspec's formats are asserted (see the module's notes).

    Each message starts with the path of the value it is about, e.g.
    `$.city: expected string, got integer`. It never raises: a schema the library rejects
    gives one message, `$: the tool's input schema is invalid (...)`, for every instance,
    so a broken tool fails loudly instead of running unchecked; so does one whose `$ref`s
    cannot be followed (see `schema_problem`). A value nested more than 64 levels deep is
    not checked: its message says so.
    """
    checker = _checker(schema, formats)
    if isinstance(checker, str):
        return [checker]
    if checker.simple is not None and checker.simple(instance):
        return []
    if checker.problem is not None:
        return [checker.problem]
    if nests_deeper(instance, _MAX_DEPTH):
        return [_TOO_DEEP]
    messages: dict[str, None] = {}
    try:
        for error in checker.validator.iter_errors(cast(Any, instance)):
            messages.update(dict.fromkeys(_messages(error)))
            if len(messages) >= MAX_ERRORS:
                break
    except Unresolvable as error:
        messages[f"$: the schema's $ref {_show(_ref_of(error))} cannot be resolved"] = None
    except RecursionError:
        messages[_TOO_DEEP] = None
    except (OverflowError, ValueError):  # the library's arithmetic and messages on huge numbers
        messages["$: validation stopped: a number is too large to check"] = None
    return list(messages)[:MAX_ERRORS]


def coerce(schema: Mapping[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` with the safe coercions a small model needs, applied where `schema` asks.

    A string argument becomes another JSON value only where the property's schema (its
    `type`, or the types of all its `anyOf`/`oneOf` alternatives, `$ref`s followed) does not
    allow a string, and only when nothing is lost:

    - integer: `"3"` -> 3, `"-12"` -> -12, `"3.0"` -> 3 (not `"3.5"`, `"1e3"` or `"03"`)
    - number: `"3.5"` -> 3.5, `"-2"` -> -2, `"1e3"` -> 1000.0 (not `"NaN"`, `"inf"` or `"1e999"`)
    - boolean: `"true"` -> true, `"false"` -> false, in any letter case (not `"yes"` or `"1"`)
    - null: `"null"` -> null (not `""` or `"None"`)
    - array: a JSON array written as a string, `"[1, 2]"` -> [1, 2]

    Inside arrays (`items`) and nested objects (`properties`) the same rules apply to each
    value, so `["1", "2"]` for an array of integers becomes [1, 2]. Arguments the schema
    already accepts are returned unchanged, as is anything when the schema is invalid.
    Never raises.
    """
    checker = _checker(schema)
    if isinstance(checker, str) or checker.problem is not None or not isinstance(arguments, dict):
        return arguments
    if checker.simple is not None and checker.simple(arguments):
        return arguments
    try:
        coerced = _coerce(schema, arguments, checker.resolver, 0)
        if coerced is arguments or checker.is_valid(arguments):
            return arguments
    except (Unresolvable, RecursionError, OverflowError, ValueError):
        return arguments
    return coerced if isinstance(coerced, dict) else arguments


def is_valid(schema: Mapping[str, Any], instance: object) -> bool:
    """Whether `instance` matches `schema` (a schema that cannot be used matches nothing)."""
    checker = _checker(schema)
    if isinstance(checker, str):
        return False
    try:
        return checker.is_valid(instance)
    except (Unresolvable, RecursionError, OverflowError, ValueError):
        return False


def schema_problem(schema: Mapping[str, Any], of: str | None = None) -> str | None:
    """Why `schema` cannot check a tool's arguments, or None when it can.

    It cannot when it is not JSON, is not valid JSON Schema (a `type` of 5, a `pattern` that
    is no regex), or holds a `$ref` that leads nowhere or back to itself without going into
    the value (`{"$ref": "#"}`), which would stop every check. The message is worded as
    `validate` words such problems, or, given `of` (the schema's name, "the output
    schema" say), names the schema so and not the tool's arguments.
    """
    checker = _checker(schema)
    problem = checker if isinstance(checker, str) else checker.problem
    if problem is None or of is None:
        return problem
    return problem.replace("the tool's input schema", of).replace(_UNCHECKED, "")


# How a tool schema's problem ends; `schema_problem(of=...)` leaves it out for other schemas.
_UNCHECKED = ", so its arguments cannot be checked"
_recent: dict[int, tuple[Mapping[str, Any], object, _Checker | str]] = {}
_recent_with_formats: dict[int, tuple[Mapping[str, Any], object, _Checker | str]] = {}


def _checker(schema: Mapping[str, Any], formats: bool = False) -> _Checker | str:
    """The compiled schema (asserting msgspec's formats, with `formats`), or the message
    that says why it cannot be used."""
    # Fast path: the same schema object as a recent call, still equal to the copy compiled
    # then (so a schema changed in place is compiled again).
    recents = _recent_with_formats if formats else _recent
    recent = recents.get(id(schema))
    if recent is not None and recent[0] is schema and recent[1] == schema:
        return recent[2]
    try:
        # The text is the cache key, and compiling from it gives the validator its own copy.
        text = json.dumps(schema, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return f"$: the tool's input schema is not JSON{_UNCHECKED}"
    checker = _compile(text, formats)
    if len(recents) >= 512:
        recents.clear()
    recents[id(schema)] = (schema, json.loads(text), checker)
    return checker


@lru_cache(maxsize=512)
def _compile(text: str, formats: bool = False) -> _Checker | str:
    try:
        schema = json.loads(text)
    except RecursionError:
        return _invalid("it nests too deeply")
    if not isinstance(schema, dict):
        return _invalid(f"expected an object, got {_kind(schema)}")
    declared = schema.get("$schema")
    known = _DIALECTS.get(declared.rstrip("#")) if isinstance(declared, str) else None
    problem = ""
    for cls in (known,) if known is not None else _UNDECLARED:
        meta = cls(cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER, registry=_OFFLINE)
        try:
            error = best_match(meta.iter_errors(schema))
        except RecursionError:
            return _invalid("it nests too deeply")
        if error is None:
            dialect = str(cls.META_SCHEMA.get("$id", cls.META_SCHEMA.get("id")))
            spec = referencing.jsonschema.specification_with(dialect)
            resolver = _OFFLINE.resolver_with_root(spec.create_resource(schema))
            # The simple check takes `format` for an annotation.
            simple = (
                None
                if cls.TYPE_CHECKER is _DRAFT4_TYPES or (formats and '"format"' in text)
                else compile_simple(schema)
            )
            # Without a $ref anywhere, there is no $ref to follow.
            refs = any(f'"{keyword}"' in text for keyword in _REFS)
            unusable = _ref_problem(schema, resolver, cls, spec) if refs else None
            validator = cls(schema, registry=_OFFLINE, format_checker=_FORMATS if formats else None)
            return _Checker(validator, resolver, simple, unusable)
        problem = problem or f"at {_path(error.absolute_path)}: {_cut(error.message, 160)}"
    return _invalid(problem)


def _ref_problem(
    schema: Mapping[str, Any],
    resolver: Resolver[Any],
    dialect: type[Validator],
    spec: referencing.Specification[Any],
) -> str | None:
    """The first `$ref` in `schema` that cannot be resolved or that leads back to itself
    without going into the value, as a message; None if there is none.

    Walks the subschemas a check can reach (not unused `$defs`), following `$ref`s as the
    library does, then looks for a cycle among the same-value edges alone.
    """
    index: dict[int, int] = {}
    edges: list[list[tuple[int, str | None]]] = []
    queue: deque[tuple[Mapping[str, Any], Resolver[Any], tuple[str | int, ...]]] = deque()

    def reach(node: Mapping[str, Any], inner: Resolver[Any], path: tuple[str | int, ...]) -> int:
        if id(node) not in index:
            index[id(node)] = len(edges)
            edges.append([])
            queue.append((node, inner, path))
        return index[id(node)]

    reach(schema, resolver, ())
    while queue:
        node, inner, path = queue.popleft()
        own = edges[index[id(node)]]
        for keyword in _REFS:
            if keyword not in node or keyword not in dialect.VALIDATORS:
                continue
            ref = node[keyword]
            if not isinstance(ref, str):  # where the meta-schema does not look, as in `$defs`
                return f"{_path(path)}: the schema's {keyword} is {_kind(ref)}, not a string"
            # The library holds the json-schema.org meta-schemas, and resolves them itself.
            if ref.startswith(_META_SCHEMAS):
                continue
            try:
                resolved = inner.lookup(ref)
            except Unresolvable:
                if keyword != "$ref":
                    continue  # a dynamic reference may be resolved at check time
                return f"{_path(path)}: the schema's $ref {_show(ref)} cannot be resolved"
            if isinstance(resolved.contents, Mapping):  # not a boolean schema, with no $refs
                target = reach(resolved.contents, resolved.resolver, (*path, keyword))
                own.append((target, f"{_path(path)}: the schema's {keyword} {_show(ref)}"))
        if "$ref" in node and dialect in _REF_ALONE:
            continue
        for keywords, in_place in ((_IN_PLACE, True), (_INTO_VALUE, False)):
            for keyword in keywords:
                if keyword not in dialect.VALIDATORS:
                    continue  # not a keyword of this dialect, so the library ignores it
                for where, sub in _subschemas(node, keyword):
                    child = inner.in_subresource(spec.create_resource(sub))
                    target = reach(sub, child, (*path, *where))
                    if in_place:
                        own.append((target, None))
    return _cycle(edges)


def _subschemas(
    node: Mapping[str, Any], keyword: str
) -> Iterator[tuple[tuple[str | int, ...], Mapping[str, Any]]]:
    """The subschemas `keyword` holds in `node` (not boolean ones, which hold no `$ref`),
    each with its path from `node`."""
    value = node.get(keyword)
    if isinstance(value, list):
        found: list[tuple[tuple[str | int, ...], object]] = [
            ((keyword, position), item) for position, item in enumerate(value)
        ]
    elif isinstance(value, Mapping) and keyword in _SCHEMA_MAPS:
        found = [((keyword, key), item) for key, item in value.items()]
    else:
        found = [((keyword,), value)]
    for where, item in found:
        if isinstance(item, Mapping):
            yield where, item


def _cycle(edges: list[list[tuple[int, str | None]]]) -> str | None:
    """A message naming a `$ref` on a cycle of `edges`, or None if they hold no cycle.

    Each edge is a target and, for a `$ref`, where it is; every cycle holds one, as the
    other edges go from a schema to one inside it.
    """
    state = [0] * len(edges)  # 0 unseen, 1 on the current path, 2 done
    for start in range(len(edges)):
        if state[start]:
            continue
        state[start] = 1
        stack: list[tuple[int, Iterator[tuple[int, str | None]], str | None]] = [
            (start, iter(edges[start]), None)
        ]
        while stack:
            node, successors, _ = stack[-1]
            for target, ref in successors:
                if state[target] == 1:
                    nodes = [frame[0] for frame in stack]
                    entered = [frame[2] for frame in stack[nodes.index(target) + 1 :]]
                    named = next(where for where in (*entered, ref) if where is not None)
                    return (
                        f"{named} leads back to itself without going into the value, "
                        "so a check would never end"
                    )
                if state[target] == 0:
                    state[target] = 1
                    stack.append((target, iter(edges[target]), ref))
                    break
            else:
                state[node] = 2
                stack.pop()
    return None


def _invalid(problem: str) -> str:
    return f"$: the tool's input schema is invalid ({problem}){_UNCHECKED}"


def _messages(error: ValidationError) -> list[str]:
    """`error` as path-first sentences: one, or one per missing or unexpected property."""
    path = _path(error.absolute_path)
    keyword, expected, value = error.validator, error.validator_value, error.instance
    if keyword == "required" and isinstance(value, Mapping) and isinstance(expected, list):
        names = [name for name in expected if isinstance(name, str) and name not in value]
        return [f"{path}: missing required property '{name}'" for name in names]
    if keyword == "additionalProperties" and expected is False and isinstance(value, Mapping):
        return _unexpected(path, error.schema, value)
    return [f"{path}: {_sentence(error, path)}"]


def _sentence(error: ValidationError, path: str) -> str:
    """What is wrong with the value at `path`, without the path."""
    keyword, expected, value = error.validator, error.validator_value, error.instance
    if keyword == "type":
        names = expected if isinstance(expected, list) else [expected]
        return f"expected {' or '.join(map(str, names))}, got {_kind(value)}"
    if keyword == "enum":
        return f"{_show(value)} is not one of {_show(expected, 200)}"
    if keyword == "const":
        return f"expected {_show(expected)}, got {_show(value)}"
    if keyword in _BOUNDS:
        flag = _DRAFT4.get(keyword, "")
        exclusive = isinstance(error.schema, Mapping) and error.schema.get(flag)
        bound = _BOUNDS["exclusiveM" + keyword[1:]] if exclusive is True else _BOUNDS[keyword]
        return f"{_show(value)} is {bound} {_show(expected)}"
    if keyword in _SIZES:
        what, units, bound = _SIZES[keyword]
        size = len(value) if isinstance(value, str | list | Mapping) else 0
        return f"{what} has {size} {units[size == 1]}, {bound} {_show(expected)}"
    if keyword == "pattern":
        return f"{_show(value)} does not match the pattern {_show(expected)}"
    if keyword == "format":
        return f"{_show(value)} is not a valid {expected}"
    if keyword == "uniqueItems":
        return "items must be unique, but some are repeated"
    if keyword == "not":
        return "must not match the schema given in 'not'"
    if keyword is None or error.schema is False:
        return f"{_show(value)} is not allowed here"
    if keyword in ("anyOf", "oneOf"):
        if not error.context:
            return f"matches more than one of the {keyword} alternatives, but must match one"
        return f"does not match any of the {keyword} alternatives: {_reasons(error, path)}"
    return _cut(error.message, 200)


_BOUNDS = {
    "minimum": "less than the minimum",
    "maximum": "greater than the maximum",
    "exclusiveMinimum": "less than or equal to the exclusive minimum",
    "exclusiveMaximum": "greater than or equal to the exclusive maximum",
    "multipleOf": "not a multiple of",
}
# Draft 4 makes `minimum`/`maximum` exclusive with a boolean beside them.
_DRAFT4 = {"minimum": "exclusiveMinimum", "maximum": "exclusiveMaximum"}
_CHARACTERS = ("characters", "character")
_ITEMS = ("items", "item")
_PROPERTIES = ("properties", "property")
_SIZES = {
    "minLength": ("string", _CHARACTERS, "fewer than the minimum"),
    "maxLength": ("string", _CHARACTERS, "more than the maximum"),
    "minItems": ("array", _ITEMS, "fewer than the minimum"),
    "maxItems": ("array", _ITEMS, "more than the maximum"),
    "minProperties": ("object", _PROPERTIES, "fewer than the minimum"),
    "maxProperties": ("object", _PROPERTIES, "more than the maximum"),
}


def _reasons(error: ValidationError, path: str) -> str:
    """The first problem with each alternative of an anyOf/oneOf, numbered from 1."""
    first: dict[int, str] = {}
    for sub in error.context:
        index = sub.relative_schema_path[0] if sub.relative_schema_path else 0
        if isinstance(index, int) and index not in first:
            messages = _messages(sub) or [f"{path}: {sub.message}"]
            first[index] = messages[0].removeprefix(f"{path}: ")
    return "; ".join(f"[{index + 1}] {first[index]}" for index in sorted(first))


def _unexpected(path: str, schema: object, value: Mapping[Any, Any]) -> list[str]:
    """One message per property that `additionalProperties: false` rejects."""
    schema = schema if isinstance(schema, Mapping) else {}
    known = schema.get("properties")
    known = known if isinstance(known, Mapping) else {}
    patterns = schema.get("patternProperties")
    patterns = list(patterns) if isinstance(patterns, Mapping) else []
    allowed = ", ".join(f"'{name}'" for name in known)
    hint = f" (allowed: {allowed})" if allowed else ""
    return [
        f"{path}: unexpected property '{key}'{hint}"
        for key in value
        if key not in known and not any(re.search(pattern, key) for pattern in patterns)
    ]


def _coerce(schema: object, value: Any, resolver: Resolver[Any], depth: int) -> Any:
    """`value` with the coercions `schema` allows, the same object when nothing changes."""
    if depth > _MAX_DEPTH:
        return value
    schema, resolver = _followed(schema, resolver, depth)
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, str):
        types = _types(schema, resolver, depth)
        if types and "string" not in types:
            value = _from_text(value, types)
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        converted = [_coerce(items, item, resolver, depth + 1) for item in value]
        if any(new is not old for new, old in zip(converted, value, strict=True)):
            return converted
    properties = schema.get("properties")
    if isinstance(value, dict) and isinstance(properties, Mapping):
        changed = {
            key: new
            for key, item in value.items()
            if key in properties
            and (new := _coerce(properties[key], item, resolver, depth + 1)) is not item
        }
        if changed:
            return {**value, **changed}
    return value


def _followed(schema: object, resolver: Resolver[Any], depth: int) -> tuple[object, Resolver[Any]]:
    """`schema` with a `$ref` it consists of followed (a bounded number of hops)."""
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        if depth > _MAX_DEPTH:
            return {}, resolver
        resolved = resolver.lookup(schema["$ref"])
        schema, resolver, depth = resolved.contents, resolved.resolver, depth + 1
    return schema, resolver


def _types(schema: Mapping[str, Any], resolver: Resolver[Any], depth: int) -> set[str]:
    """The JSON types a schema allows, from `type` or from every anyOf/oneOf alternative;
    empty when they are not all declared."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list) and all(isinstance(name, str) for name in declared):
        return set(declared)
    alternatives = schema.get("anyOf", schema.get("oneOf"))
    if not isinstance(alternatives, list) or not alternatives or depth > _MAX_DEPTH:
        return set()
    found: set[str] = set()
    for alternative in alternatives:
        followed, inner = _followed(alternative, resolver, depth)
        types = _types(followed, inner, depth + 1) if isinstance(followed, Mapping) else set()
        if not types:
            return set()
        found |= types
    return found


def _from_text(text: str, types: set[str]) -> Any:
    """The value `text` spells, of one of `types`, or `text` itself."""
    if "null" in types and text == "null":
        return None
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if types & {"integer", "number"} and _INTEGER.fullmatch(text):
        return int(text.split(".")[0])
    if "number" in types and _NUMBER.fullmatch(text):
        number = float(text)
        if math.isfinite(number):
            return number
    if "array" in types and text.lstrip().startswith("["):
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            return text
        if isinstance(parsed, list):
            return parsed
    return text


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


def _path(parts: Sequence[str | int]) -> str:
    """A location in a value, like `$.items[2]` or `$["a b"]`."""
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier():
            path += f".{part}"
        else:
            path += f"[{_show(part)}]"
    return path


def _ref_of(error: Unresolvable) -> str:
    ref = getattr(error, "ref", None)
    if not isinstance(ref, str):
        return str(error)
    return "#" + ref if ref.startswith("/") else ref  # a missing pointer comes without its "#"


def _show(value: object, limit: int = 60) -> str:
    """A value as short JSON for a message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return f"<{_kind(value)}>"
    return _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
