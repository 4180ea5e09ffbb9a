"""`--guards CONFIG`: bad configurations are InputErrors naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnkeeper.cli._guards import parse_guards
from turnkeeper.core import InputError, LoopDetection

DEEP = '{"loop": ' + "[" * 100_000


def test_inline_json_nested_too_deep_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"^--guards: the JSON nests too deeply$"):
        parse_guards(DEEP)


def test_a_file_nested_too_deep_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "guards.json"
    path.write_text(DEEP)
    with pytest.raises(InputError, match=r"^--guards: the JSON nests too deeply$"):
        parse_guards(str(path))


def test_a_shallow_config_still_parses() -> None:
    changes = parse_guards('{"loop": {"warnings": 0}, "budget": null}')
    assert changes.fields == {"loop", "budget"}
    assert changes.given.loop == LoopDetection(warnings=0)
    assert changes.given.budget is None


def test_inline_json_holding_a_byte_that_is_not_utf8_is_an_input_error() -> None:
    # How Python decodes a command-line argument holding the byte 0xff.
    with pytest.raises(InputError, match=r"^--guards: not valid JSON: not UTF-8 text$"):
        parse_guards('{"loop": {"x\udcff": 1}}')


def test_a_file_holding_a_byte_that_is_not_utf8_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "guards.json"
    path.write_bytes(b'{"loop": {"x\xff": 1}}')
    with pytest.raises(InputError, match=r"^--guards: not valid JSON: .*UTF-8"):
        parse_guards(str(path))
