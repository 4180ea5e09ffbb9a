"""Finding the lone surrogate in a JSON body msgspec refused.

JSON's grammar allows a `\\ud800` escape with no pair, but what it stands for is not text
(UTF-8 cannot hold it), and msgspec refuses it with a message about the wrong thing
("Input data was truncated"). Python's own JSON reader takes it, so the field can be found
and named.
"""

from __future__ import annotations

import json
import re
from typing import Any

from turnkeeper.core import encodes

# The escape of a surrogate (U+D800 to U+DFFF); it may be half of a pair, or follow an
# escaped backslash: the reader below decides.
_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def lone_surrogate(body: bytes) -> tuple[str, str] | None:
    """(field, message) naming the first string or key of the JSON `body` that holds a
    lone surrogate, as a path like `spec.tools[0].name` (`body` for the body itself);
    None if `body` holds none or is not JSON for another reason too."""
    if not _ESCAPE.search(body):
        return None
    try:
        value = json.loads(body, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None
    return _first(value)


def _refuse(constant: str) -> Any:
    """NaN and Infinity are not JSON, though Python's reader takes them."""
    raise ValueError(constant)


def _first(value: Any) -> tuple[str, str] | None:
    # Depth first in document order, with a stack: the body may nest deeply.
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not encodes(item):
                return _named(path, "holds")
        elif isinstance(item, dict):
            if not all(encodes(key) for key in item):
                return _named(path, "has a key that holds")
            stack.extend(reversed([(f"{path}.{key}", part) for key, part in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(f"{path}[{index}]", part) for index, part in enumerate(item)]))
    return None


def _named(path: str, what: str) -> tuple[str, str]:
    field = path.lstrip(".") or "body"
    return field, (
        f"{field}: {what} a lone surrogate (a \\ud800 to \\udfff escape without its pair), "
        "which is not text"
    )
