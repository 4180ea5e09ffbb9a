"""Pricing: prices read as the decimals they spell, costs computed and summed exactly."""

from __future__ import annotations

import re
from decimal import Decimal

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, InputError, Pricing, Usage, add_costs, check_spec


def test_a_cost_is_the_prices_decimals_times_the_tokens_over_a_million() -> None:
    pricing = Pricing(input_per_million=0.15, output_per_million=0.6)
    assert pricing.cost(1000, 500) == Decimal("0.00045")
    assert pricing.cost(0, 0) == 0
    assert Pricing(3, 15).cost(1, 1) == Decimal("0.000018")


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=50))
def test_costs_add_up_with_no_drift(tokens: list[int]) -> None:
    pricing = Pricing(0.1, 0.2)
    total = Usage()
    for count in tokens:
        total = total + Usage(count, count, pricing.cost(count, count))
    assert total.cost == Decimal("0.3") * sum(tokens) / 10**6
    assert total == Usage(sum(tokens), sum(tokens), pricing.cost(sum(tokens), sum(tokens)))


def test_no_price_known_is_no_cost() -> None:
    assert (Usage(1, 2) + Usage(3, 4)).cost is None
    assert add_costs(None, Decimal("0.5")) == Decimal("0.5")
    assert add_costs(Decimal("0.5"), None) == Decimal("0.5")


def test_pricing_round_trips_through_the_log_as_json_numbers() -> None:
    spec = AgentSpec(model="m", pricing=Pricing(0.15, 0.6))
    encoded = msgspec.json.encode(spec)
    assert b'"pricing":{"input_per_million":0.15,"output_per_million":0.6}' in encoded
    back = msgspec.json.decode(encoded, type=AgentSpec)
    assert back == spec
    assert back.pricing is not None
    assert back.pricing.cost(7, 3) == Decimal("0.00000285")
    usage = msgspec.json.encode(Usage(7, 3, Decimal("0.00000285")))
    assert usage == b'{"prompt_tokens":7,"completion_tokens":3,"cost":"0.00000285"}'
    assert msgspec.json.decode(usage, type=Usage).cost == Decimal("0.00000285")


@pytest.mark.parametrize(
    ("price", "words"),
    [
        (-0.1, "from 0 to 1,000,000,000"),
        (float("inf"), "from 0 to 1,000,000,000"),
        (2e9, "from 0 to 1,000,000,000"),
        (0.1 + 0.2, "more than 12 decimal places"),
        (True, "expected a number"),
        ("0.1", "expected a number"),
    ],
)
def test_bad_prices_are_refused_naming_the_field(price: object, words: str) -> None:
    with pytest.raises(InputError, match=rf"Pricing\.input_per_million: .*{re.escape(words)}"):
        Pricing(price, 1.0)  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError, match=r"at `\$\.pricing`"):
        msgspec.json.decode(
            b'{"pricing": {"input_per_million": 1, "output_per_million": -1}}', type=AgentSpec
        )


def test_check_spec_refuses_pricing_of_the_wrong_type() -> None:
    with pytest.raises(InputError, match=r"spec\.pricing: expected a Pricing"):
        check_spec(AgentSpec(pricing={"input_per_million": 1}))  # type: ignore[arg-type]
