"""Run every anyio test on both backends."""

from __future__ import annotations

# Imported now, not when Hypothesis first reaches its target phase: that import parses
# the module (pytest rewrites its asserts) deep inside a running test, where CPython
# 3.11.7 failed it with "SystemError: AST constructor recursion depth mismatch" (seen in
# tests/sessions/test_rebuild.py run alone; see CPython gh-106905 and pytest #10763).
import hypothesis.internal.conjecture.optimiser  # noqa: F401
import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend
