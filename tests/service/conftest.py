"""The shared service subprocess for tests/service."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.service.process import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server per test module, on its own SQLite log."""
    folder = tmp_path_factory.mktemp("service")
    with ServerProcess(folder / "log.sqlite", stderr_path=folder / "stderr.log") as running:
        yield running
