"""encodes and loggable: text a log can hold."""

from __future__ import annotations

import msgspec
import pytest

from turnkeeper.core._text import encodes, loggable

NAME = b"caf\xe9.txt".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(("text", "ok"), [("plain", True), ("café ✓", True), (NAME, False)])
def test_encodes_says_whether_utf8_holds_the_text(text: str, ok: bool) -> None:
    assert encodes(text) is ok


def test_loggable_replaces_only_lone_surrogates_and_then_encodes() -> None:
    assert loggable("café ✓") == "café ✓"
    assert loggable(NAME) == "caf?.txt"
    assert msgspec.json.decode(msgspec.json.encode(loggable(NAME))) == "caf?.txt"
