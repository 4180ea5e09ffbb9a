"""Pausing the cycle collector while a log read makes many objects at once."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Tracked objects made in one pause of the collector that make it a bulk load (see
# `gc_paused`): a read of about 5,000 events.
_BULK = 10_000


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cycle collector while many objects are made at once: envelopes being
    decoded, or the pairs `read_all` returns.

    Each event makes a few containers the collector tracks, so thousands would set off
    many collections, some of them walking every tracked object in the process
    (Mercurial's `nogc` does the same for bulk loads). Nothing made here forms a cycle.
    The switch is process-wide: code that turns the collector off meanwhile finds it back
    on after.

    A bulk load (at least `_BULK` tracked objects made in the pause) is kept, as a log
    read's caller keeps what it read: its objects would outlive the next two collections
    and be walked by each (about 8 ms for 20,000 events). They are moved to the oldest
    generation unwalked instead (`gc.freeze` then `gc.unfreeze`, each one list splice).
    Any other young objects move with them, garbage cycles among them then waiting for
    the next full collection. Nothing moves while objects are frozen: unfreezing would
    thaw them.
    """
    if not gc.isenabled():
        yield
        return
    made_before = gc.get_count()[0]
    gc.disable()
    try:
        yield
    finally:
        if gc.get_count()[0] - made_before >= _BULK and not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
        gc.enable()
