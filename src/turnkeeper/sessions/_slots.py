"""Model-call slots: the bound on a Host's model calls in flight."""

from __future__ import annotations

from collections import OrderedDict

import anyio


class Slots:
    """`total` slots, handed out first come, first served: a slot given back while
    sessions wait goes straight to the one that has waited longest.

    A Host's sessions wait here by the thousand (10,000 sessions, 150 slots). Each wait
    makes an event and parks on it, nothing more. `anyio.CapacityLimiter` on trio raises
    and catches `WouldBlock` inside every wait and keeps the exception and two tracebacks
    alive while it waits: a tenth of the objects a busy Host has alive, which every
    young collection walks again.
    """

    def __init__(self, total: int) -> None:
        self.free = total
        # The waiters' events, oldest first (an OrderedDict: a cancelled waiter leaves it
        # in O(1), and thousands may be cancelled at once when the Host stops).
        self._waiting: OrderedDict[anyio.Event, None] = OrderedDict()

    async def take(self) -> None:
        """Take a slot: at once, with no checkpoint, if one is free; else once the
        sessions that waited before have theirs and one is given back."""
        if self.free:
            self.free -= 1
            return
        granted = anyio.Event()
        self._waiting[granted] = None
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():
                # Given the slot as the wait was cancelled: the next waiter gets it.
                self.give_back()
            else:
                del self._waiting[granted]
            raise

    def give_back(self) -> None:
        """Free a slot taken: it goes to the longest waiter, if any."""
        if self._waiting:
            granted, _ = self._waiting.popitem(last=False)
            granted.set()
        else:
            self.free += 1
