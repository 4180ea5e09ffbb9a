"""Pausing the cycle collector for bulk loads: back on after, and a bulk load moved to
the oldest generation unwalked unless objects are frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from turnkeeper.core._gc import _BULK, gc_paused


def in_generation(generation: int, made: list[list[int]]) -> int:
    """How many of `made` the cycle collector holds in `generation`."""
    ids = {id(item) for item in made}
    return sum(id(item) in ids for item in gc.get_objects(generation=generation))


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The collector on, with nothing frozen, before and after the test, and its young
    generations empty at the start (so no collection the test sets off reaches the
    oldest)."""
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    gc.collect()
    yield
    gc.unfreeze()
    gc.enable()


@pytest.mark.usefixtures("collector_on")
def test_a_bulk_load_in_a_pause_goes_to_the_oldest_generation_unwalked() -> None:
    collections: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(note)
    try:
        with gc_paused():
            assert not gc.isenabled()
            made = [[index] for index in range(2 * _BULK)]
        assert gc.isenabled()
        assert gc.get_count()[0] < 100
        assert gc.get_freeze_count() == 0
        more = [[index] for index in range(gc.get_threshold()[0] * 3)]
    finally:
        gc.callbacks.remove(note)
    assert collections, "the young objects made after set off collections"
    assert in_generation(2, made) == len(made)
    assert in_generation(0, more) + in_generation(1, more) > 0


@pytest.mark.usefixtures("collector_on")
def test_a_small_load_in_a_pause_stays_young() -> None:
    with gc_paused():
        made = [[index] for index in range(100)]
    assert in_generation(2, made) == 0


@pytest.mark.usefixtures("collector_on")
def test_a_bulk_load_leaves_frozen_objects_frozen() -> None:
    frozen = [[index] for index in range(10)]
    gc.freeze()
    count = gc.get_freeze_count()
    with gc_paused():
        made = [[index] for index in range(2 * _BULK)]
    assert gc.get_freeze_count() == count
    assert in_generation(2, made) == 0
    assert in_generation(2, frozen) == 0


def test_a_pause_inside_a_pause_leaves_the_collector_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            made = [[index] for index in range(2 * _BULK)]
        assert not gc.isenabled()
        assert in_generation(2, made) == 0
    finally:
        gc.enable()
