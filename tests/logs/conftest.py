"""The stores the conformance suite (test_logs.py) runs on: each is one fixture here.

A new store joins the suite by adding a fixture that returns a `Store`, decorated with
`store_fixture` (saying whether logs opened again read what earlier ones wrote, and
whether a log opened beside a writer only reads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.postgres import drop_schema, new_schema
from turnkeeper.logs import EventLog, JsonlLog, MemoryLog, PostgresLog, SqliteLog

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Store:
    """A store to run the suite on: `open` makes a log over its storage (each call opens
    it again; `read_only` for a log that only reads, where the store has such logs), and
    `fresh` gives the same kind of store over new, empty storage."""

    name: str
    open: Callable[..., EventLog]
    fresh: Callable[[], Store]
    persistent: bool


STORES: list[str] = []
PERSISTENT_STORES: list[str] = []
SINGLE_WRITER_STORES: list[str] = []


def store_fixture(*, persistent: bool, single_writer: bool) -> Callable[[_F], Any]:
    """Register a fixture returning a Store: `persistent` if a log opened again reads what
    an earlier one wrote, `single_writer` if a log opened beside a writer (or opened
    read_only) only reads and says why."""

    def register(function: _F) -> Any:
        STORES.append(function.__name__)
        if persistent:
            PERSISTENT_STORES.append(function.__name__)
        if single_writer:
            SINGLE_WRITER_STORES.append(function.__name__)
        return pytest.fixture(function)

    return register


def _memory() -> Store:
    return Store("memory", lambda **_: MemoryLog(), _memory, persistent=False)


def _file(kind: type[JsonlLog] | type[SqliteLog], name: str, where: Path) -> Store:
    counter = iter(range(1_000_000))

    def fresh() -> Store:
        return _file(kind, name, where.with_name(f"{where.name}-{next(counter)}"))

    return Store(name, partial(kind, where), fresh, persistent=True)


@store_fixture(persistent=False, single_writer=False)
def memory_store() -> Store:
    return _memory()


@store_fixture(persistent=True, single_writer=True)
def jsonl_store(tmp_path: Path) -> Store:
    return _file(JsonlLog, "jsonl", tmp_path / "log")


@store_fixture(persistent=True, single_writer=True)
def sqlite_store(tmp_path: Path) -> Store:
    return _file(SqliteLog, "sqlite", tmp_path / "log.db")


@store_fixture(persistent=True, single_writer=False)
def postgres_store(postgres_server_url: str) -> Iterator[Store]:
    made: list[str] = []

    def fresh() -> Store:
        url = new_schema(postgres_server_url)
        made.append(url)
        return Store("postgres", partial(PostgresLog, url), fresh, persistent=True)

    yield fresh()
    for url in made:
        drop_schema(url)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Store:
    """Each store in turn."""
    chosen: Store = request.getfixturevalue(request.param)
    return chosen


@pytest.fixture(params=PERSISTENT_STORES)
def persistent_store(request: pytest.FixtureRequest) -> Store:
    """Each store whose logs opened again read what earlier ones wrote."""
    chosen: Store = request.getfixturevalue(request.param)
    return chosen


@pytest.fixture(params=SINGLE_WRITER_STORES)
def single_writer_store(request: pytest.FixtureRequest) -> Store:
    """Each store one log writes at a time (the others opened on it only read)."""
    chosen: Store = request.getfixturevalue(request.param)
    return chosen
