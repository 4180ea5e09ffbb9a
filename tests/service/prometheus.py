"""A strict reader of the Prometheus text exposition format (0.0.4), for tests."""

from __future__ import annotations

import math
import re

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>[^}}]*)\}})? (?P<value>\S+)$",
)
_LABEL = re.compile(r'^(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\\n]|\\.)*)"$')
_TYPES = {"counter", "gauge", "summary", "histogram", "untyped"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_exposition(text: str) -> tuple[Samples, dict[str, str]]:
    """(samples by (name, labels), type by metric family); AssertionError on any bad line."""
    assert text.endswith("\n"), "the exposition ends with a newline"
    samples: Samples = {}
    types: dict[str, str] = {}
    helped: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert re.fullmatch(_NAME, name), line
            assert name not in helped, f"HELP twice for {name}"
            helped.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in _TYPES, line
            assert name not in types, f"TYPE twice for {name}"
            types[name] = kind
            continue
        assert line, "no blank lines"
        assert not line.startswith("#"), f"unexpected comment {line!r}"
        found = _SAMPLE.match(line)
        assert found, f"not a sample: {line!r}"
        labels: list[tuple[str, str]] = []
        if found["labels"]:
            for pair in found["labels"].split(","):
                label = _LABEL.match(pair)
                assert label, f"bad label {pair!r} in {line!r}"
                labels.append((label["key"], label["value"]))
        value = float(found["value"])
        assert not math.isinf(value), line
        name = found["name"]
        family = name.removesuffix("_sum").removesuffix("_count")
        assert name in types or family in types, f"sample before its TYPE: {line!r}"
        key = (name, tuple(labels))
        assert key not in samples, f"sample twice: {line!r}"
        samples[key] = value
    return samples, types
