"""Costs through the public API: each model response's usage carries its cost by the
spec's pricing, the session's status sums them, replay and recheck reproduce them from
the logged usage and prices, the host counts them, and the cost budget stops a session."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec
import pytest

from tests.sessions.host_worker import SPEC, answer_for, prompt_for, settle, step_tool, stepper
from turnkeeper.core import CostBudget, GuardConfig, Pricing, Usage
from turnkeeper.events import Envelope, Halted, ModelResponded
from turnkeeper.logs import MemoryLog
from turnkeeper.sessions import Host, recheck, run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

PRICING = Pricing(input_per_million=0.15, output_per_million=0.6)
PRICED = msgspec.structs.replace(SPEC, pricing=PRICING)


def costs(events: list[Envelope]) -> list[Decimal | None]:
    return [e.event.usage.cost for e in events if isinstance(e.event, ModelResponded)]


async def test_each_step_carries_its_cost_and_the_status_sums_them_exactly() -> None:
    log = MemoryLog()
    async with Host(chat=stepper(), log=log, tools=step_tool()) as host:
        first = await host.start(PRICED, prompt_for(3), session_id="a")
        second = await host.start(PRICED, prompt_for(2), session_id="b")
        infos = [await settle(host, first), await settle(host, second)]
        total = Decimal(0)
        for info in infos:
            events = await log.read(info.session_id)
            responses = [e.event for e in events if isinstance(e.event, ModelResponded)]
            assert [r.usage.cost for r in responses] == [
                PRICING.cost(r.usage.prompt_tokens, r.usage.completion_tokens) for r in responses
            ]
            usage = info.usage
            assert usage.cost == PRICING.cost(usage.prompt_tokens, usage.completion_tokens)
            assert usage.cost == sum(cost or 0 for cost in costs(events))
            # Rebuilt from the log, and re-derived by recheck, to the digit.
            assert replay(events).usage == usage
            assert recheck(events) is None
            total += usage.cost
        assert host.cost_total == total > 0


async def test_a_session_without_pricing_has_no_cost_and_counts_none() -> None:
    async with Host(chat=stepper(), tools=step_tool()) as host:
        info = await settle(host, await host.start(SPEC, prompt_for(1)))
        assert info.usage.cost is None
        assert info.usage.prompt_tokens > 0
        assert host.cost_total == 0


async def test_the_session_budget_stops_the_next_request_before_its_model_call() -> None:
    calls: list[int] = []
    step = stepper()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        return await step(request)

    guards = GuardConfig(cost=CostBudget(max_session_cost=0.000001))
    log = MemoryLog()
    async with Host(chat=chat, log=log, tools=step_tool()) as host:
        session_id = await host.start(PRICED, prompt_for(0), guards=guards)
        spent = await settle(host, session_id)
        assert spent.text == answer_for(0)
        assert spent.usage.cost is not None
        assert spent.usage.cost >= Decimal("0.000001")
        made = len(calls)
        await host.send(session_id, prompt_for(1, "again"))
        stopped = await settle(host, session_id)
        assert (stopped.status, stopped.stop_reason) == ("halted", "cost_exceeded")
        assert stopped.text is not None
        assert "this session has cost" in stopped.text
        assert len(calls) == made
        halts = [e.event for e in await log.read(session_id) if isinstance(e.event, Halted)]
        assert [(h.guard, h.reason) for h in halts] == [("cost", "cost_exceeded")]


async def test_run_reports_the_cost_and_recheck_asks_what_a_budget_would_do() -> None:
    result = await run(PRICED, prompt_for(3), stepper(), tools=step_tool())
    assert result.text == answer_for(3)
    usage = result.usage
    assert usage == Usage(
        usage.prompt_tokens,
        usage.completion_tokens,
        PRICING.cost(usage.prompt_tokens, usage.completion_tokens),
    )
    events = list(result.events)
    first = costs(events)[0]
    assert first is not None
    tight = GuardConfig(cost=CostBudget(max_cost=float(first)))
    divergence = recheck(events, guards=tight)
    assert divergence is not None
    assert "cost_exceeded" in divergence.summary
