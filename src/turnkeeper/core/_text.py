"""Text a log can hold: UTF-8, so no lone surrogates (how Python decodes a byte that is
not UTF-8 with surrogateescape, from a file name or argv, say)."""

from __future__ import annotations


def encodes(text: str) -> bool:
    """Whether `text` encodes as UTF-8: it holds no lone surrogate."""
    # ASCII always encodes; only other text is worth the copy an encode makes.
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def loggable(text: str) -> str:
    """`text` with each lone surrogate replaced by "?"."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")
