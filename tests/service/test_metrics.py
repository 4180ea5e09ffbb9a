"""The Prometheus exposition: it parses, carries every status and counter, and its
quantiles are order statistics of the append latencies, given with their sum and count;
/v1/metrics counts every session, those the host dropped from memory too."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.service.prometheus import parse_exposition
from turnkeeper.core import AgentSpec
from turnkeeper.providers import text_response
from turnkeeper.service import create_app
from turnkeeper.service._metrics import (
    COUNTERS,
    QUANTILES,
    STATUSES,
    quantile,
    render_metrics,
)
from turnkeeper.sessions import Host

counts = st.integers(min_value=0, max_value=10**12)


@given(
    st.dictionaries(st.sampled_from(STATUSES), counts),
    st.dictionaries(st.sampled_from([name for name, _ in COUNTERS]), counts),
    st.lists(st.floats(min_value=0, max_value=100, allow_nan=False)),
    st.tuples(counts, st.floats(min_value=0, max_value=1e9, allow_nan=False)),
)
def test_the_exposition_parses_and_carries_every_value(
    statuses: dict[str, int],
    counters: dict[str, int],
    seconds: list[float],
    appended: tuple[int, float],
) -> None:
    samples, types = parse_exposition(render_metrics(statuses, counters, seconds, appended))
    for status in STATUSES:
        assert samples[("turnkeeper_sessions", (("status", status),))] == statuses.get(status, 0)
    for name, _ in COUNTERS:
        assert types[f"turnkeeper_{name}_total"] == "counter"
        assert samples[(f"turnkeeper_{name}_total", ())] == counters.get(name, 0)
    for q in QUANTILES:
        value = samples[("turnkeeper_log_append_seconds", (("quantile", str(q)),))]
        if seconds:
            assert value in seconds
        else:
            assert math.isnan(value)
    # A summary carries its sum and count, over every append (they only ever grow).
    assert samples[("turnkeeper_log_append_seconds_sum", ())] == appended[1]
    assert samples[("turnkeeper_log_append_seconds_count", ())] == appended[0]


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1), st.floats(0, 1))
def test_a_quantile_is_an_order_statistic(values: list[float], q: float) -> None:
    ordered = sorted(values)
    found = quantile(ordered, q)
    assert found in values
    below = sum(value <= found for value in values)
    assert below >= q * len(values)


def test_quantiles_of_known_values() -> None:
    ordered = [float(n) for n in range(1, 101)]
    assert quantile(ordered, 0.5) == 50.0
    assert quantile(ordered, 0.99) == 99.0
    assert quantile(ordered, 0.0) == 1.0
    assert math.isnan(quantile([], 0.5))


@pytest.mark.anyio
async def test_metrics_count_dropped_sessions_without_reading_them_back() -> None:
    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        return text_response("done")

    async with Host(chat=chat, max_resting=1) as host:
        for n in range(4):
            await host.start(AgentSpec(system_prompt="Answer."), "go", session_id=f"s{n}")
            await host.result(f"s{n}")
        await host.cancel("s0")
        held = set(host._sessions)
        assert len(held) == 1
        app = create_app(host, token="metrics-token")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://service",
            headers={"Authorization": "Bearer metrics-token"},
        ) as client:
            response = await client.get("/v1/metrics")
        assert response.status_code == 200
        samples, _ = parse_exposition(response.text)
        counted = {
            status: samples[("turnkeeper_sessions", (("status", status),))] for status in STATUSES
        }
        assert counted == {
            status: {"idle": 3, "cancelled": 1}.get(status, 0) for status in STATUSES
        }
        assert set(host._sessions) == held
