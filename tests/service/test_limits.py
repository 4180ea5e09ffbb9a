"""Limits: sensible defaults, and bad values refused with the field named."""

from __future__ import annotations

import math
from typing import Any

import pytest

from turnkeeper.core import InputError
from turnkeeper.service import DEFAULT_LIMITS, Limits


def test_defaults_allow_ordinary_requests() -> None:
    assert Limits() == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.max_body_bytes >= 1_000_000
    assert DEFAULT_LIMITS.max_wait_seconds == 60.0
    assert DEFAULT_LIMITS.body_timeout_seconds == 60.0
    assert DEFAULT_LIMITS.header_timeout_seconds == 10.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_body_bytes", 0),
        ("max_text_chars", -1),
        ("max_tool_result_chars", 1.5),
        ("max_page", True),
        ("max_history_messages", -1),
        ("max_wait_seconds", math.inf),
        ("max_wait_seconds", -0.5),
        ("max_wait_seconds", "60"),
        ("body_timeout_seconds", 0),
        ("body_timeout_seconds", -1.0),
        ("body_timeout_seconds", math.nan),
        ("body_timeout_seconds", math.inf),
        ("body_timeout_seconds", False),
        ("body_timeout_seconds", "30"),
        ("header_timeout_seconds", 0),
        ("header_timeout_seconds", math.inf),
        ("header_timeout_seconds", True),
    ],
)
def test_bad_limits_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InputError, match=f"Limits.{field}"):
        Limits(**{field: value})


def test_zero_history_and_zero_wait_are_allowed() -> None:
    limits = Limits(max_history_messages=0, max_wait_seconds=0)
    assert limits.max_history_messages == 0
