"""Model-call slots: taken at once while free, then handed over in the order asked, and
never lost to a waiter that does not take it."""

from __future__ import annotations

from turnkeeper.sessions._slots import Slots


class Waiters:
    """The grant function of a Slots: notes who is granted a slot, refusing the ones in
    `refusing`."""

    def __init__(self, refusing: set[int] | None = None) -> None:
        self.refusing = refusing or set()
        self.granted: list[int] = []

    def __call__(self, waiter: int) -> bool:
        if waiter in self.refusing:
            return False
        self.granted.append(waiter)
        return True


def test_free_slots_are_taken_until_none_is_left() -> None:
    slots: Slots[int] = Slots(2, Waiters())
    assert slots.take()
    assert slots.take()
    assert not slots.take()
    assert slots.free == 0
    slots.give_back()
    slots.give_back()
    assert slots.free == 2


def test_a_slot_given_back_goes_to_the_longest_waiter() -> None:
    waiters = Waiters()
    slots: Slots[int] = Slots(1, waiters)
    assert slots.take()
    for number in range(5):
        slots.wait(number)
    for _ in range(5):
        slots.give_back()
    assert waiters.granted == [0, 1, 2, 3, 4]
    # Each was handed the slot: none was free meanwhile.
    assert slots.free == 0
    slots.give_back()
    assert slots.free == 1


def test_a_newcomer_does_not_take_a_slot_handed_to_a_waiter() -> None:
    waiters = Waiters()
    slots: Slots[int] = Slots(1, waiters)
    assert slots.take()
    slots.wait(7)
    slots.give_back()
    assert waiters.granted == [7]
    assert not slots.take()


def test_a_waiter_that_does_not_take_its_slot_passes_it_on() -> None:
    waiters = Waiters(refusing={0, 1, 3})
    slots: Slots[int] = Slots(1, waiters)
    assert slots.take()
    for number in range(4):
        slots.wait(number)
    slots.give_back()
    assert waiters.granted == [2]
    slots.give_back()
    # 3 refuses, and nobody else waits: the slot is free.
    assert waiters.granted == [2]
    assert slots.free == 1


def test_thousands_of_waiters_refusing_at_once_leave_the_slot_free() -> None:
    # As when a Host stops: every waiter is refused its task, one after another.
    waiters = Waiters(refusing=set(range(5000)))
    slots: Slots[int] = Slots(1, waiters)
    assert slots.take()
    for number in range(5000):
        slots.wait(number)
    slots.give_back()
    assert waiters.granted == []
    assert slots.free == 1
