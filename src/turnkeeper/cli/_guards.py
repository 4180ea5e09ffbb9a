"""`--guards CONFIG`: changes to a guard configuration, from inline JSON or a JSON file.

Each top-level field given replaces that guard's settings (`null` turns it off); the
fields left out keep what the session has: the defaults for `run`, the logged
configuration for `replay`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from turnkeeper.core import GuardConfig, InputError, check_guards


def _unknown_field(
    value: Any, info: msgspec.inspect.Type, path: str
) -> tuple[str, list[str]] | None:
    """The path of the first key in `value` that `info` has no field for, and the fields
    there, if any; msgspec itself ignores unknown keys, so a misspelt guard would silently
    keep its default."""
    if isinstance(info, msgspec.inspect.UnionType):
        for member in info.types:
            found = _unknown_field(value, member, path)
            if found is not None:
                return found
        return None
    if not (isinstance(info, msgspec.inspect.StructType) and isinstance(value, dict)):
        return None
    fields = {field.encode_name: field for field in info.fields}
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            return f"{path}.{key}", list(fields)
        found = _unknown_field(item, field.type, f"{path}.{key}")
        if found is not None:
            return found
    return None


class GuardChanges(msgspec.Struct, frozen=True):
    """The guards a `--guards` object names, with their new settings."""

    given: GuardConfig
    fields: frozenset[str]

    def over(self, base: GuardConfig) -> GuardConfig:
        """`base` with the named guards' settings replaced."""
        changes = {name: getattr(self.given, name) for name in self.fields}
        return msgspec.structs.replace(base, **changes)


def parse_guards(config: str) -> GuardChanges:
    """The changes in `config`: JSON text if it starts with `{`, else a JSON file's path.
    Raises InputError naming the field that is unknown, of the wrong type or out of range."""
    if config.lstrip().startswith("{"):
        try:
            data = config.encode()
        except UnicodeEncodeError:  # a lone surrogate: how Python decodes a non-UTF-8 argv byte
            raise InputError("--guards: not valid JSON: not UTF-8 text") from None
    else:
        path = Path(config)
        if not path.is_file():
            raise InputError(f"--guards: {config!r} is neither a JSON object nor a file")
        data = path.read_bytes()
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise InputError(f"--guards: not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's decoder, on nesting deeper than the stack allows
        raise InputError("--guards: the JSON nests too deeply") from None
    if not isinstance(raw, dict):
        raise InputError(f"--guards: expected a JSON object, got {type(raw).__name__}")
    unknown = _unknown_field(raw, msgspec.inspect.type_info(GuardConfig), "$")
    if unknown is not None:
        where, known = unknown
        raise InputError(f"--guards: unknown field `{where}` (expected one of: {', '.join(known)})")
    try:
        given = msgspec.convert(raw, GuardConfig)
    except msgspec.ValidationError as exc:
        raise InputError(f"--guards: {exc}") from None
    try:
        check_guards(given)
    except InputError as exc:
        raise InputError(f"--guards: {exc}") from None
    return GuardChanges(given, frozenset(raw))
