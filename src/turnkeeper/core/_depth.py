"""How deep a value nests: shared by the message helpers and JSON-schema validation (which
the spec types import, so it cannot import the message helpers)."""

from __future__ import annotations

_CONTAINERS = (dict, list, tuple)


def nests_deeper(value: object, limit: int) -> bool:
    """Whether `value` holds dicts, lists or tuples more than `limit` levels deep (one alone
    is 1 level). Walks a level at a time, not recursively, and stops past `limit`."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    for _ in range(limit):
        if not level:
            return False
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)
            if isinstance(item, _CONTAINERS)
        ]
    return bool(level)
