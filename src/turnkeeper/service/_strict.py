"""Unknown fields anywhere in a request body, and integers written as `3.0`.

The top-level body Structs forbid unknown fields, but the types nested in them
(`AgentSpec`, `ToolSpec`, `ToolResult`, `GuardConfig`...) are also the event log's, which
must read logs whose events hold fields a later version added: so a request body is
checked against its type's fields on its own, after it has decoded.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from msgspec import inspect

_SEQUENCES = (inspect.ListType, inspect.VarTupleType, inspect.SetType, inspect.FrozenSetType)


def unknown_field(value: Any, kind: type) -> str | None:
    """The path (`results[0].is_eror`) of the first field of `value`, a body decoded as
    plain JSON that decodes as `kind`, that `kind` does not have; None if there is none."""
    return _unknown(value, _info(kind), "")


@functools.cache
def _info(kind: type) -> inspect.Type:
    return inspect.type_info(kind)


def _unknown(value: Any, info: inspect.Type, path: str) -> str | None:
    if isinstance(info, inspect.Metadata):
        return _unknown(value, info.type, path)
    if isinstance(info, inspect.UnionType):
        member = _member_for(value, info)
        return None if member is None else _unknown(value, member, path)
    for item, item_info, item_path in _parts(value, info, path):
        if item_info is None:
            return item_path.lstrip(".")
        found = _unknown(item, item_info, item_path)
        if found is not None:
            return found
    return None


def _parts(
    value: Any, info: inspect.Type, path: str
) -> Iterator[tuple[Any, inspect.Type | None, str]]:
    """The values inside `value`, each with the type `info` gives it (None for a field
    a Struct does not have) and its path."""
    if isinstance(info, inspect.StructType) and isinstance(value, dict):
        fields = {field.encode_name: field.type for field in info.fields}
        for key, item in value.items():
            if key != info.tag_field:
                yield item, fields.get(key), f"{path}.{key}"
    elif isinstance(info, _SEQUENCES) and isinstance(value, list):
        for index, item in enumerate(value):
            yield item, info.item_type, f"{path}[{index}]"
    elif isinstance(info, inspect.TupleType) and isinstance(value, list):
        for index, (item, item_type) in enumerate(zip(value, info.item_types, strict=False)):
            yield item, item_type, f"{path}[{index}]"
    elif isinstance(info, inspect.DictType) and isinstance(value, dict):
        for key, item in value.items():
            yield item, info.value_type, f"{path}.{key}"


def _member_for(value: Any, info: inspect.UnionType) -> inspect.Type | None:
    """The member of a union that `value` decoded as: the Struct its tag names (or the one
    Struct) for an object, the one sequence type for an array."""
    if isinstance(value, dict):
        structs = [t for t in info.types if isinstance(t, inspect.StructType)]
        if len(structs) == 1:
            return structs[0]
        for struct in structs:
            if struct.tag_field is not None and value.get(struct.tag_field) == struct.tag:
                return struct
        return None
    if isinstance(value, list):
        sequences = [t for t in info.types if isinstance(t, (*_SEQUENCES, inspect.TupleType))]
        return sequences[0] if len(sequences) == 1 else None
    return None


def integral_floats_as_ints(value: Any, kind: type) -> Any:
    """`value`, a body decoded as plain JSON, with each float that has no fraction made
    an int where `kind` takes an int: JSON has one kind of number, and JSON Schema's
    integers include `3.0`, which msgspec refuses for an int. `value` itself if it has
    none."""
    return _integral(value, _info(kind))


def _integral(value: Any, info: inspect.Type) -> Any:
    if isinstance(info, inspect.Metadata):
        return _integral(value, info.type)
    if isinstance(value, float):
        ints = info.types if isinstance(info, inspect.UnionType) else (info,)
        takes_int = any(isinstance(t, inspect.IntType) for t in ints)
        return int(value) if takes_int and value.is_integer() else value
    if isinstance(info, inspect.UnionType):
        member = _member_for(value, info)
        return value if member is None else _integral(value, member)
    inner: dict[Any, inspect.Type] = {}
    if isinstance(info, inspect.StructType) and isinstance(value, dict):
        fields = {field.encode_name: field.type for field in info.fields}
        inner = {key: fields[key] for key in value if key in fields}
    elif isinstance(info, _SEQUENCES) and isinstance(value, list):
        inner = dict.fromkeys(range(len(value)), info.item_type)
    elif isinstance(info, inspect.TupleType) and isinstance(value, list):
        inner = dict(enumerate(info.item_types[: len(value)]))
    elif isinstance(info, inspect.DictType) and isinstance(value, dict):
        inner = dict.fromkeys(value, info.value_type)
    changed = {
        key: item
        for key, item_info in inner.items()
        if (item := _integral(value[key], item_info)) is not value[key]
    }
    if not changed:
        return value
    if isinstance(value, dict):
        return {**value, **changed}
    return [changed.get(index, item) for index, item in enumerate(value)]
