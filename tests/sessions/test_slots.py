"""Model-call slots: taken at once while free, then handed over in the order asked, and
never lost to a cancelled wait."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest

from turnkeeper.sessions._slots import Slots

pytestmark = pytest.mark.anyio


async def test_free_slots_are_taken_without_waiting() -> None:
    slots = Slots(2)
    with anyio.CancelScope() as scope:
        scope.cancel()
        # No checkpoint while a slot is free: a cancelled task still takes it.
        await slots.take()
        await slots.take()
    assert slots.free == 0
    slots.give_back()
    slots.give_back()
    assert slots.free == 2


async def test_a_slot_given_back_goes_to_the_longest_waiter() -> None:
    slots = Slots(1)
    await slots.take()
    order: list[int] = []

    async def session(number: int) -> None:
        await slots.take()
        order.append(number)
        await anyio.sleep(0.001)
        slots.give_back()

    async with anyio.create_task_group() as group:
        for number in range(5):
            group.start_soon(session, number)
            # Each in turn is waiting before the next asks.
            await anyio.wait_all_tasks_blocked()
        slots.give_back()
    assert order == [0, 1, 2, 3, 4]
    assert slots.free == 1


async def test_a_newcomer_does_not_take_a_slot_handed_to_a_waiter() -> None:
    slots = Slots(1)
    await slots.take()
    got: list[str] = []

    async def waiter() -> None:
        await slots.take()
        got.append("waiter")

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        slots.give_back()
        # The slot is the waiter's now, though it has not run yet.
        assert slots.free == 0
        with anyio.move_on_after(0.05):
            await slots.take()
            got.append("newcomer")
    assert got == ["waiter"]


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_nothing() -> None:
    slots = Slots(1)
    await slots.take()
    got: list[int] = []

    async def session(number: int, scope: anyio.CancelScope) -> None:
        with scope:
            await slots.take()
            got.append(number)
            slots.give_back()

    scopes = [anyio.CancelScope() for _ in range(3)]
    async with anyio.create_task_group() as group:
        for number, scope in enumerate(scopes):
            group.start_soon(session, number, scope)
            await anyio.wait_all_tasks_blocked()
        scopes[0].cancel()
        scopes[1].cancel()
        await anyio.wait_all_tasks_blocked()
        slots.give_back()
    assert got == [2]
    assert slots.free == 1


async def test_a_slot_handed_over_as_its_wait_is_cancelled_is_not_lost() -> None:
    slots = Slots(1)
    await slots.take()
    got: list[str] = []
    first_scope = anyio.CancelScope()

    async def first() -> None:
        with first_scope:
            await slots.take()
            # The wait may end with the slot (trio) before the cancellation lands here.
            try:
                got.append("first")
                await anyio.lowlevel.checkpoint()
            finally:
                slots.give_back()

    async def second() -> None:
        await slots.take()
        got.append("second")
        slots.give_back()

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        group.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        slots.give_back()
        first_scope.cancel()
    assert "second" in got
    assert slots.free == 1


async def test_thousands_of_waiters_cancelled_at_once_leave_every_slot_free() -> None:
    slots = Slots(3)
    for _ in range(3):
        await slots.take()
    async with anyio.create_task_group() as group:
        for _ in range(5000):
            group.start_soon(slots.take)
        await anyio.wait_all_tasks_blocked()
        group.cancel_scope.cancel()
    for _ in range(3):
        slots.give_back()
    assert slots.free == 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_wait_cancelled_after_its_slot_was_handed_over_passes_the_slot_on() -> None:
    # An asyncio task cancelled from outside anyio after its event was set: the wait
    # raises though the slot is its own.
    slots = Slots(1)
    await slots.take()
    first = asyncio.ensure_future(slots.take())
    second = asyncio.ensure_future(slots.take())
    await anyio.wait_all_tasks_blocked()
    slots.give_back()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert slots.free == 0
    slots.give_back()
    assert slots.free == 1
