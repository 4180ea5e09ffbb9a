"""Whether a value reads back from the log as it is."""

from __future__ import annotations

import math

_SCALARS = frozenset({str, int, bool, type(None)})


def is_plain_json(value: object, limit: int) -> bool:
    """Whether `value` is JSON as a decoder makes it (dicts with string keys, lists,
    strings, ints, finite floats, booleans, None; no subclasses), at most `limit` levels
    of dicts and lists deep: whether the log reads it back equal to itself. Walks a level
    at a time, not recursively."""
    level = [value]
    depth = 0
    while level:
        nested: list[object] = []
        for item in level:
            if isinstance(item, dict):
                if type(item) is not dict or depth == limit:
                    return False
                for key, member in item.items():
                    if type(key) is not str:
                        return False
                    nested.append(member)
            elif isinstance(item, list):
                if type(item) is not list or depth == limit:
                    return False
                nested.extend(item)
            elif isinstance(item, float):
                if type(item) is not float or not math.isfinite(item):
                    return False
            elif type(item) not in _SCALARS:
                return False
        level = nested
        depth += 1
    return True
