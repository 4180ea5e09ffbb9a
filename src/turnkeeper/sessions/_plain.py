"""Whether a value reads back from the log as it is."""

from __future__ import annotations

import math

_SCALARS = frozenset({str, int, bool, type(None)})


def is_plain_json(value: object, limit: int) -> bool:
    """Whether the log reads `value` back equal to itself, at most `limit` levels of dicts
    and lists deep: it holds only dicts with string keys, lists, strings, ints, finite
    floats, booleans and None. A dict or list subclass counts (it reads back as a dict or
    list, which equals it); not so a tuple or set (read back as a list), a NaN or
    infinity (null), a key that is not a string, or any other type, a str or int subclass
    included. Walks a level at a time, not recursively."""
    level = [value]
    depth = 0
    while level:
        nested: list[object] = []
        for item in level:
            kind = type(item)
            if kind in _SCALARS:
                continue
            if isinstance(item, dict):
                if depth == limit:
                    return False
                for key, member in item.items():
                    if type(key) is not str:
                        return False
                    nested.append(member)
            elif isinstance(item, list):
                if depth == limit:
                    return False
                nested.extend(item)
            elif not isinstance(item, float) or kind is not float or not math.isfinite(item):
                return False
        level = nested
        depth += 1
    return True
