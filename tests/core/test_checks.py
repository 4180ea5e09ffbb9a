"""check_count and check_seconds: what they take, and errors naming the field."""

from __future__ import annotations

import math
import sys

import pytest

from turnkeeper.core import MAX_SETTING, check_count, check_seconds
from turnkeeper.core._errors import InputError
from turnkeeper.core._pricing import check_limit


@pytest.mark.parametrize("value", [-1, True, 1.0, "2", None])
def test_a_count_is_an_integer_at_least_the_least(value: object) -> None:
    with pytest.raises(InputError, match=r"^n: expected an integer >= 0, got "):
        check_count("n", value, 0)
    check_count("n", 0, 0)
    check_count("n", 10**400, 0)


def test_an_optional_count_says_none_is_allowed() -> None:
    with pytest.raises(InputError, match=r"^n: expected None or an integer >= 1, got 0$"):
        check_count("n", 0, 1, optional=True)


@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf, 10**400, False, "1"])
def test_seconds_are_finite_and_not_negative(value: object) -> None:
    with pytest.raises(InputError, match=r"^s: expected a number of seconds from 0 to 1e15, got "):
        check_seconds("s", value)
    check_seconds("s", 0)
    check_seconds("s", 1.5)


def test_positive_seconds_refuse_zero_and_say_so() -> None:
    with pytest.raises(
        InputError, match=r"^s: expected None or a number of seconds over 0 to 1e15"
    ):
        check_seconds("s", 0, positive=True, optional=True)
    check_seconds("s", 1e-9, positive=True)


@pytest.mark.parametrize("past", [int(MAX_SETTING) + 1, 2**53 + 1, int(sys.float_info.max) + 1])
def test_seconds_and_cost_limits_stop_where_a_json_integer_past_them_stays_past(
    past: int,
) -> None:
    # Read into a float field (as the API's JSON is), an integer just past the largest
    # float rounds down onto it: a bound under 2**53 keeps every integer past it past it.
    assert float(past) > MAX_SETTING
    check_seconds("s", MAX_SETTING)
    check_limit(MAX_SETTING, "l")
    for value in (past, float(past)):
        with pytest.raises(InputError, match=r"^s: expected a number of seconds from 0 to 1e15"):
            check_seconds("s", value)
        with pytest.raises(InputError, match=r"^l: expected a number over 0 to 1e15"):
            check_limit(value, "l")


def test_a_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(InputError) as refused:
        check_seconds("s", 10**400)
    assert len(str(refused.value)) < 160
