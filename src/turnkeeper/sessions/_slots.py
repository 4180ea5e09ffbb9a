"""Model-call slots: the bound on a Host's model calls in flight."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

_W = TypeVar("_W")


class Slots(Generic[_W]):
    """`total` slots, handed out first come, first served: a slot given back while some
    wait goes straight to the one that has waited longest, by `grant(waiter)`, which
    says whether the waiter took it (else the next one is offered it).

    A Host's sessions wait here by the thousand (10,000 sessions, 150 slots), and each
    waits with no task: `grant` starts its task. A task parked on an event for its slot
    was a dozen coroutines, events and closures, which every young collection of the
    cycle collector walked again, and a few KB of memory, for each waiting session.
    """

    def __init__(self, total: int, grant: Callable[[_W], bool]) -> None:
        self.free = total
        self._grant = grant
        # The waiters, oldest first.
        self._waiting: OrderedDict[_W, None] = OrderedDict()

    def take(self) -> bool:
        """Take a free slot; False if none is free (then `wait` for one)."""
        if self.free:
            self.free -= 1
            return True
        return False

    def wait(self, waiter: _W) -> None:
        """Queue `waiter` for the next slot given back."""
        self._waiting[waiter] = None

    def give_back(self) -> None:
        """Free a slot taken: it goes to the longest waiter that takes it, if any."""
        waiting = self._waiting
        while waiting:
            waiter, _ = waiting.popitem(last=False)
            if self._grant(waiter):
                return
        self.free += 1
