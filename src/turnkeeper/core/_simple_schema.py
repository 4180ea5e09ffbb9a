"""A fast, exact validity check for the simple schemas most tools declare.

The `jsonschema` library takes tens of microseconds per check, even for
`{"type": "object", "properties": {"q": {"type": "string"}}}`, and every tool call is
checked. Schemas built only from `type`, `properties`, `required`,
`additionalProperties`, `items`, string `enum`s and annotations compile here to a
plain function with the library's verdict; anything else is left to the library.
Only schemas the library has already accepted (of draft 6 or later, where 1.0 is an
integer) are compiled, so this never judges an invalid schema.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping

Check = Callable[[object], bool]

# Keywords that never affect validity as turnkeeper checks (`format` is not asserted).
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
    }
)
_KEYWORDS = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
}


def _is_integer(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Number)


_TYPES: dict[str, Check] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
    "integer": _is_integer,
    "number": _is_number,
}


def _accept(value: object) -> bool:
    return True


def _reject(value: object) -> bool:
    return False


def compile_simple(schema: object, *, top: bool = True) -> Check | None:
    """A function telling whether a value matches `schema` exactly as the library would,
    or None when the schema uses anything beyond the simple subset."""
    if schema is True:
        return _accept
    if schema is False:
        return _reject
    if not isinstance(schema, Mapping):
        return None
    allowed = _KEYWORDS | {"$schema"} if top else _KEYWORDS
    if any(key not in allowed for key in schema):
        return None
    type_check = _type_check(schema.get("type"))
    declared = schema.get("properties", {})
    required = schema.get("required", [])
    enum = schema.get("enum")
    if (
        type_check is None
        or not isinstance(declared, Mapping)
        or not isinstance(required, list)
        or (enum is not None and not _all_strings(enum))
    ):
        return None
    properties: dict[str, Check] = {}
    for name, subschema in declared.items():
        compiled = compile_simple(subschema, top=False)
        if compiled is None:
            return None
        properties[name] = compiled
    additional: Check | None = None
    if schema.get("additionalProperties", True) is not True:
        additional = compile_simple(schema["additionalProperties"], top=False)
        if additional is None:
            return None
    items = compile_simple(schema["items"], top=False) if "items" in schema else _accept
    if items is None:
        return None
    return _node(type_check, properties, tuple(required), additional, items, enum)


def _all_strings(values: object) -> bool:
    return isinstance(values, list) and all(isinstance(value, str) for value in values)


def _type_check(declared: object) -> Check | None:
    if declared is None:
        return _accept
    if isinstance(declared, str):
        return _TYPES.get(declared)
    if isinstance(declared, list) and all(name in _TYPES for name in declared):
        checks = [_TYPES[name] for name in declared]
        return lambda value: any(check(value) for check in checks)
    return None


def _node(
    type_check: Check,
    properties: dict[str, Check],
    required: tuple[str, ...],
    additional: Check | None,
    items: Check,
    enum: list[str] | None,
) -> Check:
    """The check of one schema node, from its compiled parts."""
    choices = frozenset(enum) if enum is not None else None

    def check(value: object) -> bool:
        if not type_check(value):
            return False
        if choices is not None and not (isinstance(value, str) and value in choices):
            return False
        if isinstance(value, dict):
            for name in required:
                if name not in value:
                    return False
            for key, item in value.items():
                sub = properties.get(key, additional)
                if sub is not None and not sub(item):
                    return False
        elif isinstance(value, list) and items is not _accept:
            return all(items(item) for item in value)
        return True

    return check
