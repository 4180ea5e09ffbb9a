"""Prices of a model and the cost of its calls, in exact decimal arithmetic.

A price is a JSON number in the logged spec (what a user writes), read as the decimal
its shortest form spells (`0.15`, not the binary float nearest it), so a cost is the same
exact `Decimal` live, in a replay and in a re-check: nothing is rounded, ever.
"""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from typing import overload

import msgspec

from turnkeeper.core._checks import MAX_SETTING
from turnkeeper.core._errors import InputError

MAX_AMOUNT = 1e9
"""The largest price per million tokens a spec takes."""
MAX_DECIMALS = 12
"""The most decimal places a price may have."""

# Prices of at most 21 digits times token counts of at most 19 digits, summed: far within
# 64 digits, so no sum is ever rounded; and one that would be raises rather than drifts.
_EXACT = decimal.Context(prec=64, traps=[decimal.Inexact, decimal.InvalidOperation])
_MILLION = Decimal(1_000_000)


class Pricing(msgspec.Struct, frozen=True):
    """The price of the spec's model per million prompt (input) and completion (output)
    tokens, in a currency of your choosing: numbers from 0 to 1e9 with at most 12 decimal
    places. Each model call's usage then carries its cost (`Usage.cost`)."""

    input_per_million: float
    output_per_million: float

    def __post_init__(self) -> None:
        for field in ("input_per_million", "output_per_million"):
            exact_amount(getattr(self, field), f"Pricing.{field}")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> Decimal:
        """The exact cost of a call that used these tokens."""
        prompt = _EXACT.multiply(Decimal(prompt_tokens), as_decimal(self.input_per_million))
        completion = _EXACT.multiply(
            Decimal(completion_tokens), as_decimal(self.output_per_million)
        )
        return _EXACT.divide(_EXACT.add(prompt, completion), _MILLION)


def exact_amount(value: object, where: str = "price") -> Decimal:
    """The decimal a price spells; InputError, naming `where`, unless it is a number from 0
    to MAX_AMOUNT with at most MAX_DECIMALS decimal places (so sums of costs stay short)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: expected a number, got {value!r:.80}")
    if not (math.isfinite(value) and 0 <= value <= MAX_AMOUNT):
        raise InputError(
            f"{where}: expected a number from 0 to {MAX_AMOUNT:,.0f}, got {value!r:.80}"
        )
    exact = as_decimal(value)
    exponent = exact.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -MAX_DECIMALS:
        raise InputError(f"{where}: {value!r} has more than {MAX_DECIMALS} decimal places")
    return exact


def check_limit(value: object, where: str) -> None:
    """InputError, naming `where`, unless `value` is a number over 0 to MAX_SETTING: a cost
    limit, compared exactly (as `as_decimal` spells it) with what calls cost."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: expected a number, got {value!r:.80}")
    if not 0 < value <= MAX_SETTING:
        raise InputError(f"{where}: expected a number over 0 to 1e15, got {value!r:.80}")


def as_decimal(value: float) -> Decimal:
    """The decimal a JSON number spells: a float's shortest repr (which reads back as the
    same float, and is what JSON holds), not the binary value nearest it."""
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


@overload
def add_costs(first: Decimal, second: Decimal | None) -> Decimal: ...
@overload
def add_costs(first: Decimal | None, second: Decimal | None) -> Decimal | None: ...
def add_costs(first: Decimal | None, second: Decimal | None) -> Decimal | None:
    """The exact sum of two costs; None (no price known) only when both are."""
    if second is None:
        return first
    if first is None:
        return second
    return _EXACT.add(first, second)
