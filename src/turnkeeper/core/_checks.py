"""Checks of counts and seconds given as input, with errors naming the field."""

from __future__ import annotations

from turnkeeper.core._errors import InputError

MAX_SETTING = 1e15
"""The largest number a setting of seconds or of a cost limit takes (in seconds, about 31
million years). Under 2**53, where every whole number is a float exactly: a JSON integer
past the bound stays past it as the float it is read into, where one past the largest
float would round down onto it and be taken."""


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
    """Raise InputError, naming `name`, unless `value` is a number of seconds (not a bool)
    from 0 (more than 0 if `positive`) to MAX_SETTING; `optional`: the message says None is
    allowed too."""
    # NaN fails both comparisons; an int past the float range compares exactly (where
    # math.isfinite would overflow on it).
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_SETTING
        or (positive and value == 0)
    ):
        allowed = f"a number of seconds {'over' if positive else 'from'} 0 to 1e15"
        if optional:
            allowed = "None or " + allowed
        raise InputError(f"{name}: expected {allowed}, got {value!r:.80}")
