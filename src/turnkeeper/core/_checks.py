"""Checks of counts and seconds given as input, with errors naming the field."""

from __future__ import annotations

import sys

from turnkeeper.core._errors import InputError


def check_count(name: str, value: object, least: int, *, optional: bool = False) -> None:
    """Raise InputError, naming `name`, unless `value` is an integer (not a bool) >=
    `least`; `optional`: the message says None is allowed too."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        allowed = f"an integer >= {least}"
        if optional:
            allowed = "None or " + allowed
        raise InputError(f"{name}: expected {allowed}, got {value!r:.80}")


def check_seconds(
    name: str, value: object, *, positive: bool = False, optional: bool = False
) -> None:
    """Raise InputError, naming `name`, unless `value` is a finite number of seconds (not a
    bool), >= 0 or, if `positive`, > 0; `optional`: the message says None is allowed too."""
    # NaN fails both comparisons; an int past the float range compares exactly (where
    # math.isfinite would overflow on it), and neither a timer nor a float field of the
    # log could hold it.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= sys.float_info.max
        or (positive and value == 0)
    ):
        allowed = "a finite number of seconds " + ("> 0" if positive else ">= 0")
        if optional:
            allowed = "None or " + allowed
        raise InputError(f"{name}: expected {allowed}, got {value!r:.80}")
