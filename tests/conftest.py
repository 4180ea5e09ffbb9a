"""Run every anyio test on both backends; give Hypothesis examples no deadline; a
PostgreSQL server for the test run, and an empty schema on it for each test that asks."""

from __future__ import annotations

from collections.abc import Iterator

# Imported now, not when Hypothesis first reaches its target phase: that import parses
# the module (pytest rewrites its asserts) deep inside a running test, where CPython
# 3.11.7 failed it with "SystemError: AST constructor recursion depth mismatch" (seen in
# tests/sessions/test_rebuild.py run alone; see CPython gh-106905 and pytest #10763).
import hypothesis.internal.conjecture.optimiser  # noqa: F401
import pytest
from hypothesis import settings

from tests.postgres import drop_schema, new_schema, postgres_server

# A deadline is a timing assertion, and a loaded machine fails it at random (speed is
# measured in bench/). Tests that set their own settings keep them.
settings.register_profile("turnkeeper", deadline=None)
settings.load_profile("turnkeeper")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A PostgreSQL server for the whole run (see tests/postgres.py)."""
    with postgres_server() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A URL of an empty schema of its own on the test server, dropped after the test."""
    url = new_schema(postgres_server_url)
    yield url
    drop_schema(url)
